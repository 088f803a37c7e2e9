package qemu

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/netnstest"
)

// rackRegistry is the cluster registry's address as the rack names it: the control
// plane's advertise address and registry.port (cluster.yaml's registry.enabled), which
// gpuboot hands the nodes (cluster.registry, JoinBundle.registry) and `tenants apply`
// writes into the tenants' pull Secrets. Images are named by it.
const rackRegistry = joinHost + ":5000"

// registryPull is the start of a tenant user's day (issue 30): ada, a user of alpha,
// gets her registry credentials from `users add`, pushes the probe image under alpha/
// with Debian's skopeo, and a pod in alpha that names no pull secret runs it: the
// node's containerd pulled it from the cluster registry, trusting the cluster CA through
// the hosts.toml gpuagent wrote from the JoinBundle, with alpha's pull Secret (on its
// default ServiceAccount). A pod in beta naming alpha's image is refused its pull.
// tenantIsolation has applied both tenants.
func registryPull(t *testing.T, ctx context.Context, env *netnstest.Env, ns, bin string, cp *namespacedControlPlane,
	admin kubernetes.Interface, node *corev1.Node) {
	t.Helper()
	ada := addRackUser(t, env, ns, bin, cp, "ada", "alpha")
	archive := filepath.Join(t.TempDir(), "probe.tar")
	if out, err := exec.Command(filepath.Join(repoRoot(t), "hack", "probe-image.sh"), archive).CombinedOutput(); err != nil {
		t.Fatalf("hack/probe-image.sh: %v\n%s", err, out)
	}
	ref := rackRegistry + "/alpha/probe:v1"
	took := ada.push(t, "docker-archive:"+archive, ref)
	t.Logf("ada (tenant alpha) pushed %s with skopeo in %s", ref, took.Round(time.Millisecond))

	pod := probePodIn("alpha", node, "registry-pull", "resolve", "kubernetes.default")
	pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = ref, corev1.PullAlways
	t0 := time.Now()
	if p, err := runPodToEnd(ctx, admin, pod, 3*time.Minute); err != nil {
		t.Fatalf("a pod in alpha running %s: %v\nevents: %s\n%s", ref, err, eventMessages(ctx, admin, "alpha", "Pod", pod.Name, ""), terminationMessage(p))
	}
	t.Logf("a pod in alpha pulled %s from the cluster registry (alpha's pull Secret, the cluster CA through hosts.toml) and ran to its end in %s",
		ref, time.Since(t0).Round(time.Millisecond))
	checkPullRefused(t, ctx, admin, node, ref)
}

// checkPullRefused: a pod in beta naming alpha's image gets no further than its pull
// (beta's pull Secret is good only under beta/), and kubelet's event says so.
func checkPullRefused(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, ref string) {
	t.Helper()
	pod := probePodIn("beta", node, "registry-pull-refused", "resolve", "kubernetes.default")
	pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = ref, corev1.PullAlways
	if _, err := admin.CoreV1().Pods("beta").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().Pods("beta").Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	var reason, msg string
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		p, err := admin.CoreV1().Pods("beta").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil {
				t.Fatalf("a pod in beta ran alpha's image %s: %+v", ref, cs.State)
			}
			if w := cs.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				reason, msg = w.Reason, w.Message
			}
		}
		if reason != "" {
			break
		}
	}
	events := eventMessages(ctx, admin, "beta", "Pod", pod.Name, "Failed")
	if reason == "" || !strings.Contains(events+msg, "403") && !strings.Contains(strings.ToLower(events+msg), "denied") && !strings.Contains(events+msg, "Forbidden") {
		t.Fatalf("a pod in beta naming alpha's image %s: reason %q, %q; events: %s; want its pull refused by the registry's token issuer", ref, reason, msg, events)
	}
	if len(events) > 400 {
		events = events[:400] + " [cut]"
	}
	t.Logf("a pod in beta naming alpha's image: %s, as wanted (%s)", reason, events)
}

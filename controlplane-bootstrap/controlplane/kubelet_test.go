package controlplane_test

import (
	"context"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/hostnode"
)

// A real kubelet joins with a bootstrap token (hostnode: containerd and kubelet on
// this machine, in a network namespace of the test's own): its CSR is approved by the
// controller-manager, the Node goes Ready and a pod from a locally imported image runs.
func TestRealKubeletJoinRunsPod(t *testing.T) {
	hostnode.Require(t)
	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	hn := hostnode.Start(t, c, hostnode.Options{})
	node, pauseTag, token := hn.Name, hn.PauseImage, hn.Token
	ctx := ctxFor(t, 4*time.Minute)
	start := time.Now()
	hn.WaitReady(t, ctx)
	t.Logf("node %s Ready %.1fs after the kubelet started", node, time.Since(start).Seconds())
	csrs, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approved := false
	for _, r := range csrs.Items {
		if r.Spec.Username == "system:bootstrap:"+token[:6] && len(r.Status.Certificate) > 0 {
			approved = slices.ContainsFunc(r.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
				return c.Type == certificatesv1.CertificateApproved
			})
		}
	}
	if !approved {
		t.Error("no approved, issued CSR from the bootstrap token")
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "local-image", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: new(bool),
			Containers:                   []corev1.Container{{Name: "pause", Image: pauseTag, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			t.Logf("pod %s Running on %s with IP %s", p.Name, p.Spec.NodeName, p.Status.PodIP)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pod not Running: %v %+v\n%s", err, p.Status, hn.Logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

//go:build linux

package qemu

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/cdi/cditest"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/pxe/server"
)

// gpuHold is how long each of the two GPU pods holds its GPUs after listing them: long
// enough for both to run at once under TCG.
const gpuHold = 90 * time.Second

// simGPUNodeChecks is what a QEMU node of the simulated GPU image (simGPUImage:
// the tiny image with gpu.simulator, its agent serving the simulator's 8 GPUs to the
// node's real kubelet through the device plugin, and nvidia-container-runtime in CDI
// mode behind containerd 1.6) must do, with gpuboot allowing simulated machines:
//   - the Node says simulated (gpurack.io/simulated=true) and kubelet counts 8
//     nvidia.com/gpu;
//   - two pods asking for 2 GPUs each run at once; each container sees exactly its 2
//     /dev/nvidiaN (the simulation's null devices) plus nvidiactl and nvidia-uvm, and
//     the two share none;
//   - an XID 79 injected on GPU 3 through the agent's API (mutual TLS, the operator
//     certificate `gpuboot init` wrote) takes it out of the Node's allocatable in the
//     apiserver (7), a pod asking for the node's 8 stays Pending with the scheduler's
//     reason, and once the fault is cleared and the hysteresis passes, 8 again;
//   - after `systemctl restart kubelet` on the node the plugin registers again: a GPU
//     pod runs with its GPU.
//
// beforeClear, when set, runs while the XID is still failing GPU 3 (the rack's wait for
// the metrics server to have scraped it, which the alert check then relies on).
func simGPUNodeChecks(t *testing.T, ctx context.Context, admin kubernetes.Interface, g *namespacedGpuboot, node *corev1.Node, ip string, xidAt *time.Time,
	beforeClear func()) {
	if node.Labels[nodecontract.LabelSimulated] != "true" {
		t.Errorf("Node %s labels %v: no %s=true on a simulated GPU node", node.Name, node.Labels, nodecontract.LabelSimulated)
	}
	awaitNodeGPUs(t, ctx, admin, node.Name, 8, "the device plugin's 8 simulated GPUs")

	// Two pods at once, 2 GPUs each.
	t0 := time.Now()
	names := []string{"gpu-a", "gpu-b"}
	for _, name := range names {
		if _, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuProbePod(node, name, 2, "devices", gpuHold.String()), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, 4*time.Minute, "gpu-a and gpu-b Running at once on "+node.Name, func() bool {
		running := 0
		for _, name := range names {
			if p, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == len(names)
	}, func() string { return podsStatus(ctx, admin, names...) })
	t.Logf("gpu-a and gpu-b (2 GPUs each) running at once on %s, %s after they were created", node.Name, time.Since(t0).Round(time.Second))
	seen := map[string][]int{}
	for _, name := range names {
		var got *corev1.Pod
		waitFor(t, ctx, gpuHold+2*time.Minute, name+" to end", func() bool {
			p, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			got = p
			return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
		}, func() string { return podStatus(got) })
		if got.Status.Phase != corev1.PodSucceeded {
			t.Fatalf("%s failed: %s", name, podStatus(got))
		}
		idx, problems := cditest.SimulatedDevices(terminationMessage(got), 2)
		for _, p := range problems {
			t.Errorf("%s: %s", name, p)
		}
		seen[name] = idx
	}
	if slices.ContainsFunc(seen["gpu-a"], func(i int) bool { return slices.Contains(seen["gpu-b"], i) }) {
		t.Errorf("gpu-a has GPUs %v and gpu-b %v: they share a GPU", seen["gpu-a"], seen["gpu-b"])
	}
	t.Logf("gpu-a saw GPUs %v, gpu-b %v", seen["gpu-a"], seen["gpu-b"])
	deletePods(t, ctx, admin, names...)

	// A fatal XID on GPU 3 costs that GPU alone, and it comes back.
	agent := agentClient(t, g, ip, node.Name)
	t0 = time.Now()
	*xidAt = t0
	if _, err := agent.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
		t.Fatalf("InjectFault xid:79@gpu3 on %s's agent: %v", node.Name, err)
	}
	awaitNodeGPUs(t, ctx, admin, node.Name, 7, "GPU 3 withdrawn after XID 79")
	t.Logf("XID 79 on GPU 3 -> Node %s allocatable nvidia.com/gpu 7 in the apiserver: %s", node.Name, time.Since(t0).Round(time.Millisecond))
	all := gpuProbePod(nil, "gpu-all", 8, "devices")
	all.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node.Name}
	if _, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, all, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitUnschedulable(t, ctx, admin, "gpu-all", "Insufficient "+nodecontract.ResourceGPU)
	deletePods(t, ctx, admin, "gpu-all")
	if beforeClear != nil {
		beforeClear()
	}
	t0 = time.Now()
	if _, err := agent.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Fatalf("ClearFaults on %s's agent: %v", node.Name, err)
	}
	awaitNodeGPUs(t, ctx, admin, node.Name, 8, "GPU 3 back after the fault cleared and the hysteresis passed")
	t.Logf("fault cleared -> GPU 3 back (8 allocatable): %s", time.Since(t0).Round(time.Second))

	// kubelet restarts: the device plugin registers again and GPUs are still given out.
	// The pods of the node's other checks wait meanwhile (kubeletRestart).
	kubeletRestart.Lock()
	defer kubeletRestart.Unlock()
	t0 = time.Now()
	waitPodSucceeded(t, ctx, admin, restartUnitsPod(node, "restart-kubelet", "kubelet.service"), 4*time.Minute)
	t.Logf("kubelet.service restarted on %s (%s)", node.Name, time.Since(t0).Round(time.Second))
	// A pod admitted before the plugin has registered again (or before kubelet has
	// heard from the apiserver) fails with UnexpectedAdmissionError: kubelet's
	// behaviour with any device plugin. The test says so and tries again.
	for attempt := 1; ; attempt++ {
		name := fmt.Sprintf("gpu-after-restart-%d", attempt)
		p, err := runPodToEnd(ctx, admin, gpuProbePod(node, name, 1, "devices"), 3*time.Minute)
		if err == nil {
			if _, problems := cditest.SimulatedDevices(terminationMessage(p), 1); len(problems) > 0 {
				t.Errorf("%s: %s", name, strings.Join(problems, "; "))
			}
			t.Logf("kubelet restarted -> a GPU pod ran with its GPU (%s, attempt %d)", time.Since(t0).Round(time.Second), attempt)
			break
		}
		if p == nil || p.Status.Reason != "UnexpectedAdmissionError" || attempt == 10 {
			t.Fatalf("%s after kubelet's restart: %v", name, err)
		}
		t.Logf("%s, %s after kubelet's restart: %s: %s; trying again", name, time.Since(t0).Round(time.Second), p.Status.Reason, p.Status.Message)
		deletePods(t, ctx, admin, name)
		time.Sleep(5 * time.Second)
	}
}

// gpuProbePod is a probe pod asking for gpus nvidia.com/gpu, on node when it is set
// (otherwise the scheduler places it), running the probe with args.
func gpuProbePod(node *corev1.Node, name string, gpus int, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Args: args,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					nodecontract.ResourceGPU: resource.MustParse(strconv.Itoa(gpus))}}}}},
	}
	if node != nil {
		p.Spec.NodeName = node.Name
	}
	return p
}

// awaitNodeGPUs waits until Node name's allocatable nvidia.com/gpu in the apiserver is
// want.
func awaitNodeGPUs(t *testing.T, ctx context.Context, admin kubernetes.Interface, name string, want int64, what string) {
	t.Helper()
	var got string
	waitFor(t, ctx, 3*time.Minute, fmt.Sprintf("%s: Node %s allocatable %s %d", what, name, nodecontract.ResourceGPU, want), func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := n.Status.Allocatable[nodecontract.ResourceGPU]
		got = q.String()
		return q.Value() == want
	}, func() string { return "allocatable " + nodecontract.ResourceGPU + ": " + got })
}

// awaitUnschedulable waits until pod name (default namespace) is Pending with the
// scheduler's Unschedulable condition saying want; a pod bound to a node fails the test.
func awaitUnschedulable(t *testing.T, ctx context.Context, admin kubernetes.Interface, name, want string) {
	t.Helper()
	var last string
	waitFor(t, ctx, 2*time.Minute, "pod "+name+" Pending: "+want, func() bool {
		p, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was bound to %s; want it Pending (%s)", name, p.Spec.NodeName, want)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				last = c.Reason + ": " + c.Message
				if c.Reason == corev1.PodReasonUnschedulable && strings.Contains(c.Message, want) {
					return true
				}
			}
		}
		return false
	}, func() string { return "last condition: " + last })
	t.Logf("pod %s Pending: %s", name, last)
}

// deletePods deletes pods (default namespace) at once and waits until they are gone.
func deletePods(t *testing.T, ctx context.Context, admin kubernetes.Interface, names ...string) {
	t.Helper()
	deletePodsIn(t, ctx, admin, metav1.NamespaceDefault, names...)
}

// deletePodsIn is deletePods in namespace ns.
func deletePodsIn(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns string, names ...string) {
	t.Helper()
	zero := int64(0)
	for _, name := range names {
		if err := admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatalf("delete pod %s/%s: %v", ns, name, err)
		}
	}
	waitFor(t, ctx, 2*time.Minute, "pods "+strings.Join(names, ", ")+" deleted", func() bool {
		for _, name := range names {
			if _, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
				return false
			}
		}
		return true
	})
}

// podsStatus is podStatus of each of the named pods (default namespace).
func podsStatus(ctx context.Context, admin kubernetes.Interface, names ...string) string {
	var out []string
	for _, name := range names {
		p, err := admin.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			out = append(out, name+": "+err.Error())
			continue
		}
		out = append(out, name+": "+podStatus(p))
	}
	return strings.Join(out, "\n")
}

// agentClient dials the agent of node nodeName at ip:50051 from gpuboot's namespace
// with mutual TLS: the operator certificate `gpuboot init` wrote, the gpurack CA, and
// the agent's certificate named for its node.
func agentClient(t *testing.T, g *namespacedGpuboot, ip, nodeName string) agentv1.AgentServiceClient {
	t.Helper()
	cfg, err := server.OperatorTLS(g.creds)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ServerName = nodeName
	creds := credentials.NewTLS(cfg)
	conn, err := grpc.NewClient("passthrough:///"+ip+":50051", grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return nsDial(g.ns)(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentv1.NewAgentServiceClient(conn)
}

//go:build linux

// Package gpupods runs GPU pods on a real kubelet and a real containerd (hostnode:
// both on this machine, in a network namespace of the test's own) with gpuagent's
// device plugin and the GPU container runtime a bookworm image ships
// (nvidia-container-runtime in CDI mode, built from the pinned toolkit, as default
// runtime behind containerd 1.6). The GPUs are the simulator's, and everything says
// so: the CDI spec maps null-device nodes (1:3), labelled simulated, to /dev/nvidiaN.
package gpupods

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpurack/gpurack/agent/cdi/cditest"
	"github.com/gpurack/gpurack/agent/deviceplugin"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/hostnode"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// TestMain stops the shared control plane after the package's tests.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// probeImage is the tag hack/probe-image.sh gives the probe archive.
const probeImage = "gpurack.io/probe:v1"

// The device plugin on a real kubelet, with a simulated DGX H100 (8 GPUs):
//   - kubelet registers it and the Node's allocatable nvidia.com/gpu becomes 8;
//   - two pods asking for 2 GPUs each run at once, and each container sees exactly
//     its 2 /dev/nvidiaN (plus nvidiactl and nvidia-uvm), never the other's, as
//     kubelet's pod-resources API also says; a pod without GPUs sees none, even
//     with NVIDIA_VISIBLE_DEVICES=all in its environment;
//   - an XID 79 on gpu3 takes it out of the Node's allocatable in the apiserver
//     (7), a pod asking for 8 stays Pending with the scheduler's reason, and once
//     the fault clears and the hysteresis passes the GPU comes back (8) and that
//     pod runs with all 8;
//   - after kubelet restarts, the plugin registers again and a GPU pod still runs;
//   - time-sliced as 2 replicas per GPU, kubelet counts 16, and pods get replicas of
//     distinct GPUs first.
func TestGPUPodsOnRealKubelet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	g := newGPUNode(t, ctx, gpuNodeOptions{name: "gpu-node-1", pods: true, statusEvery: kubejoin.NodeStatusUpdateFrequency})
	hn, cs, s, mon := g.hn, g.cs, g.sim, g.mon
	plugin, stopPlugin := g.startPlugin(1)

	start := time.Now()
	hn.WaitReady(t, ctx)
	awaitAllocatable(t, ctx, cs, hn, 8, "the device plugin's 8 GPUs")
	t.Logf("node Ready with 8 nvidia.com/gpu allocatable %.1fs after kubelet started", time.Since(start).Seconds())
	pr := podResourcesClient(t, hn)
	checkGPUPods(t, ctx, g, plugin)
	ns := hn.Netns

	// A fatal XID on gpu3 costs that GPU alone.
	t0 := time.Now()
	if _, err := s.Inject(sim.Fault{Kind: sim.KindXID, GPU: 3, Value: 79}, 0); err != nil {
		t.Fatal(err)
	}
	awaitAllocatable(t, ctx, cs, hn, 7, "gpu3 withdrawn after XID 79")
	t.Logf("XID 79 on gpu3 → Node allocatable nvidia.com/gpu 7 in the apiserver: %s", time.Since(t0).Round(time.Millisecond))
	createPod(t, ctx, cs, gpuPod("", "gpu-all", 8, nil))
	awaitUnschedulable(t, ctx, cs, "gpu-all", "Insufficient "+nodecontract.ResourceGPU)
	s.Clear()
	mon.GPUsReset([]int{3})
	awaitAllocatable(t, ctx, cs, hn, 8, "gpu3 back after the fault cleared")
	pod := awaitPod(t, ctx, cs, hn, "gpu-all")
	checkSimulatedDevices(t, "gpu-all", podDevices(t, ctx, ns, pod.Status.PodIP), 8)
	deletePod(t, ctx, cs, "gpu-all")

	// kubelet restarts (its device manager removes the plugin's socket): the plugin
	// registers again, and GPUs are still given out.
	regs := plugin.Registrations()
	t0 = time.Now()
	if err := hn.RestartKubelet(); err != nil {
		t.Fatal(err)
	}
	for plugin.Registrations() == regs {
		if ctx.Err() != nil {
			t.Fatalf("the device plugin did not register again after kubelet restarted\n%s", hn.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("kubelet restarted → the device plugin registered again: %s", time.Since(t0).Round(time.Millisecond))
	// The Node's allocatable in the apiserver is the old kubelet's until the new one
	// posts; kubelet's own view is its pod-resources GetAllocatableResources. A pod
	// admitted before the plugin's first device list fails with
	// UnexpectedAdmissionError (kubelet's behaviour with any device plugin).
	for n := 0; n != 8; n = len(allocatableGPUs(ctx, pr)) {
		if ctx.Err() != nil {
			t.Fatalf("kubelet does not list 8 allocatable GPUs after its restart (%d)\n%s", n, hn.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	awaitAllocatable(t, ctx, cs, hn, 8, "the 8 GPUs after kubelet restarted")
	// Until kubelet has heard from the apiserver (its "sources ready"), it still
	// counts devices its checkpoint gave to pods deleted before the restart (gpu-all
	// here), and a GPU pod admitted then fails with UnexpectedAdmissionError:
	// kubelet's behaviour with any device plugin. The test says so and tries again.
	for attempt := 1; ; attempt++ {
		name := fmt.Sprintf("gpu-after-restart-%d", attempt)
		createPod(t, ctx, cs, gpuPod(hn.Name, name, 1, nil))
		pod, failed := awaitRunningOrFailed(t, ctx, cs, hn, name)
		if !failed {
			checkSimulatedDevices(t, name, podDevices(t, ctx, ns, pod.Status.PodIP), 1)
			break
		}
		if pod.Status.Reason != "UnexpectedAdmissionError" || attempt == 5 {
			t.Fatalf("%s after kubelet's restart: %s: %s\n%s", name, pod.Status.Reason, pod.Status.Message, hn.Logs())
		}
		t.Logf("%s, %s after kubelet's restart: %s: %s; trying again", name, time.Since(t0).Round(time.Millisecond), pod.Status.Reason, pod.Status.Message)
		time.Sleep(time.Second)
		deletePod(t, ctx, cs, name)
	}
	deletePods(t, ctx, cs)

	// Time-slicing: the plugin restarted with 2 replicas per GPU (the profile's
	// gpu.sharing.timeSlicing.replicas). kubelet counts 16; a pod asking for 3 gets
	// replicas of 3 different GPUs (GetPreferredAllocation spreads them), and one
	// asking for the other 13 gets all 8 GPUs, sharing 3 with the first.
	stopPlugin()
	_, stopPlugin = g.startPlugin(2)
	defer stopPlugin()
	awaitAllocatable(t, ctx, cs, hn, 16, "8 GPUs time-sliced as 2 devices each")
	createPod(t, ctx, cs, gpuPod(hn.Name, "sliced-3", 3, nil))
	pod = awaitPod(t, ctx, cs, hn, "sliced-3")
	three := checkSimulatedDevices(t, "sliced-3", podDevices(t, ctx, ns, pod.Status.PodIP), 3)
	createPod(t, ctx, cs, gpuPod(hn.Name, "sliced-13", 13, nil))
	pod = awaitPod(t, ctx, cs, hn, "sliced-13")
	checkSimulatedDevices(t, "sliced-13", podDevices(t, ctx, ns, pod.Status.PodIP), 8)
	replicaIDs := podResources(t, ctx, pr)
	if len(replicaIDs["sliced-3"]) != 3 || len(replicaIDs["sliced-13"]) != 13 || !strings.Contains(replicaIDs["sliced-3"][0], "::") {
		t.Errorf("kubelet's pod-resources: %v; want 3 and 13 replica IDs (<UUID>::<r>)", replicaIDs)
	}
	t.Logf("time-sliced: sliced-3 on GPUs %v, kubelet's IDs %v", three, replicaIDs["sliced-3"])
}

// deletePods deletes every pod in default and waits until they are gone.
func deletePods(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		deletePod(t, ctx, cs, p.Name)
	}
}

// The trixie images' path: containerd 1.7 resolves the device plugin's CDI devices
// itself (enable_cdi, the CRI field kubelet passes from Allocate), no GPU runtime in
// between. The same pods as on containerd 1.6 get exactly their GPUs.
func TestGPUPodsNativeCDI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	g := newGPUNode(t, ctx, gpuNodeOptions{name: "gpu-node-cdi", pods: true, nativeCDI: true, statusEvery: kubejoin.NodeStatusUpdateFrequency})
	plugin, stop := g.startPlugin(1)
	defer stop()
	g.hn.WaitReady(t, ctx)
	root, _ := filepath.Abs("../..")
	want, _ := containerd17Version(t, root)
	if log, err := os.ReadFile(filepath.Join(g.hn.Dir, "containerd.log")); err != nil || !strings.Contains(string(log), "version="+want+"\n") {
		t.Fatalf("the node's containerd is not %s (%v):\n%s", want, err, g.hn.Logs())
	}
	awaitAllocatable(t, ctx, g.cs, g.hn, 8, "the device plugin's 8 GPUs")
	checkGPUPods(t, ctx, g, plugin)
}

// checkGPUPods runs two pods of 2 GPUs at once and checks that each container has
// exactly its GPUs' device nodes, never the other's, as kubelet's pod-resources API
// (read by agent/podres, as the agent's metrics read it) also says; and that a pod
// without GPUs gets none, even with NVIDIA_VISIBLE_DEVICES=all. It deletes the pods.
func checkGPUPods(t *testing.T, ctx context.Context, g *gpuNode, plugin *deviceplugin.Plugin) {
	t.Helper()
	hn, cs, ns := g.hn, g.cs, g.hn.Netns
	indexOf := map[string]int{}
	for _, d := range plugin.Devices() {
		indexOf[d.UUID] = d.Index
	}
	seen := map[string][]int{}
	for _, name := range []string{"gpu-a", "gpu-b"} {
		createPod(t, ctx, cs, gpuPod(hn.Name, name, 2, nil))
	}
	for _, name := range []string{"gpu-a", "gpu-b"} {
		pod := awaitPod(t, ctx, cs, hn, name)
		seen[name] = checkSimulatedDevices(t, name, podDevices(t, ctx, ns, pod.Status.PodIP), 2)
	}
	if slices.ContainsFunc(seen["gpu-a"], func(i int) bool { return slices.Contains(seen["gpu-b"], i) }) {
		t.Errorf("gpu-a has GPUs %v and gpu-b %v: they share a GPU", seen["gpu-a"], seen["gpu-b"])
	}
	holders, err := podres.List(ctx, podres.Socket(hn.KubeletDir()))
	if err != nil {
		t.Fatal(err)
	}
	fromKubelet := map[string][]int{}
	for uuid, hs := range holders {
		for _, h := range hs {
			if h.Namespace != "default" || h.Container != "probe" {
				t.Errorf("GPU %s held by %+v", uuid, h)
			}
			fromKubelet[h.Pod] = append(fromKubelet[h.Pod], indexOf[uuid])
		}
	}
	for name, idx := range seen {
		slices.Sort(fromKubelet[name])
		if !slices.Equal(fromKubelet[name], idx) {
			t.Errorf("%s: kubelet's pod-resources says GPUs %v, the container sees %v", name, fromKubelet[name], idx)
		}
	}
	createPod(t, ctx, cs, gpuPod(hn.Name, "no-gpu", 0, []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}))
	pod := awaitPod(t, ctx, cs, hn, "no-gpu")
	if got := podDevices(t, ctx, ns, pod.Status.PodIP); strings.Contains(got, "/dev/") {
		t.Errorf("a pod without nvidia.com/gpu (NVIDIA_VISIBLE_DEVICES=all) got device nodes:\n%s", got)
	}
	for _, name := range []string{"gpu-a", "gpu-b", "no-gpu"} {
		deletePod(t, ctx, cs, name)
	}
}

// gpuPod is a probe pod (serving HTTP, /devices) asking for gpus nvidia.com/gpu,
// bound to node when node is set (otherwise the scheduler places it).
func gpuPod(node, name string, gpus int, env []corev1.EnvVar) *corev1.Pod {
	c := corev1.Container{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Env: env}
	if gpus > 0 {
		q := resource.MustParse(strconv.Itoa(gpus))
		c.Resources.Limits = corev1.ResourceList{nodecontract.ResourceGPU: q}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: new(bool),
			TerminationGracePeriodSeconds: new(int64), Containers: []corev1.Container{c}},
	}
}

func createPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
}

// deletePod deletes the pod and waits until it is gone, so its GPUs are free again.
func deletePod(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) {
	t.Helper()
	if err := cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s not deleted", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitPod waits until the pod is Running (with an IP) and returns it; a pod that
// fails instead fails t.
func awaitPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, hn *hostnode.Node, name string) *corev1.Pod {
	t.Helper()
	p, failed := awaitRunningOrFailed(t, ctx, cs, hn, name)
	if failed {
		t.Fatalf("pod %s failed: %s: %s\n%s", name, p.Status.Reason, p.Status.Message, hn.Logs())
	}
	return p
}

// awaitRunningOrFailed waits until the pod is Running with an IP, or Failed.
func awaitRunningOrFailed(t *testing.T, ctx context.Context, cs kubernetes.Interface, hn *hostnode.Node, name string) (pod *corev1.Pod, failed bool) {
	t.Helper()
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" || p.Status.Phase == corev1.PodFailed) {
			return p, p.Status.Phase == corev1.PodFailed
		}
		if ctx.Err() != nil {
			var st any = err
			if p != nil {
				st = p.Status
			}
			t.Fatalf("pod %s not Running: %+v\n%s", name, st, hn.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitUnschedulable waits until the scheduler says why the pod cannot be placed,
// with want in its message.
func awaitUnschedulable(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, want string) {
	t.Helper()
	var last string
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					last = c.Reason + ": " + c.Message
					if c.Reason == corev1.PodReasonUnschedulable && strings.Contains(c.Message, want) {
						t.Logf("pod %s Pending: %s", name, last)
						return
					}
				}
			}
			if p.Spec.NodeName != "" {
				t.Fatalf("pod %s was bound to %s; want it Pending (%s)", name, p.Spec.NodeName, want)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s: no Unschedulable condition saying %q; last %q", name, want, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitAllocatable waits until the Node's allocatable nvidia.com/gpu is want.
func awaitAllocatable(t testing.TB, ctx context.Context, cs kubernetes.Interface, hn *hostnode.Node, want int64, what string) {
	t.Helper()
	var got int64 = -1
	for {
		n, err := cs.CoreV1().Nodes().Get(ctx, hn.Name, metav1.GetOptions{})
		if err == nil {
			if q, ok := n.Status.Allocatable[nodecontract.ResourceGPU]; ok {
				got = q.Value()
			}
			if got == want {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: Node allocatable %s is %d, want %d\n%s", what, nodecontract.ResourceGPU, got, want, hn.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// podDevices asks the probe in the pod at ip (from namespace ns) what it got.
func podDevices(t *testing.T, ctx context.Context, ns, ip string) string {
	t.Helper()
	var body string
	err := netnstest.InNamespace(ns, func() error {
		// A Running pod's probe may not listen yet (the pods have no readiness probe):
		// a refused connection is tried again for a while.
		var conn net.Conn
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			conn, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", net.JoinHostPort(ip, "8080"))
			if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return err
		}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}}
		defer client.CloseIdleConnections()
		resp, err := client.Get("http://" + net.JoinHostPort(ip, "8080") + "/devices")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, b)
		}
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("the probe at %s: %v", ip, err)
	}
	return body
}

// checkSimulatedDevices checks a container's /devices answer (cditest.SimulatedDevices)
// and returns the GPU indices, sorted.
func checkSimulatedDevices(t *testing.T, pod, got string, n int) []int {
	t.Helper()
	idx, problems := cditest.SimulatedDevices(got, n)
	for _, p := range problems {
		t.Errorf("%s: %s", pod, p)
	}
	return idx
}

// podResourcesClient dials kubelet's pod-resources API.
func podResourcesClient(t *testing.T, hn *hostnode.Node) podresourcesapi.PodResourcesListerClient {
	t.Helper()
	sock := podres.Socket(hn.KubeletDir())
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return podresourcesapi.NewPodResourcesListerClient(conn)
}

// allocatableGPUs is kubelet's GetAllocatableResources: the nvidia.com/gpu device IDs
// it would allocate (none while it cannot answer, such as during its restart).
func allocatableGPUs(ctx context.Context, pr podresourcesapi.PodResourcesListerClient) []string {
	resp, err := pr.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return nil
	}
	var ids []string
	for _, d := range resp.GetDevices() {
		if d.GetResourceName() == nodecontract.ResourceGPU {
			ids = append(ids, d.GetDeviceIds()...)
		}
	}
	return ids
}

// podResources is kubelet's pod-resources List: the nvidia.com/gpu device IDs of each
// pod in default, by pod name.
func podResources(t *testing.T, ctx context.Context, pr podresourcesapi.PodResourcesListerClient) map[string][]string {
	t.Helper()
	resp, err := pr.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("kubelet pod-resources List: %v", err)
	}
	out := map[string][]string{}
	for _, pr := range resp.GetPodResources() {
		if pr.GetNamespace() != "default" {
			continue
		}
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == nodecontract.ResourceGPU {
					out[pr.GetName()] = append(out[pr.GetName()], d.GetDeviceIds()...)
				}
			}
		}
	}
	return out
}

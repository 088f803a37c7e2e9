package kubejoin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

func TestSanitizeLabel(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3": "NVIDIA-H100-80GB-HBM3",
		"535.261.03":            "535.261.03",
		"-a/b (c)-":             "ab-c",
	} {
		if got := SanitizeLabel(in); got != want {
			t.Errorf("SanitizeLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func condition(n *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestSimulatedJoin runs against a real kube-apiserver: TLS bootstrap with a bootstrap
// token, Node registration with nvidia.com/gpu from the simulator, GPUHealthy from the
// agent's health, an injected XID 79 turning it False and clearing turning it back.
func TestSimulatedJoin(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t0 := time.Now()
	cfg, err := Bootstrap(ctx, c.Server, c.CAPEM, token, "gpu-node-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TLS bootstrap (CSR approved and signed) in %v", time.Since(t0).Round(time.Millisecond))
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := nodeClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := who.Status.UserInfo.Username; u != "system:node:gpu-node-1" {
		t.Fatalf("node credentials authenticate as %q", u)
	}

	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "gpu-node-1"})
	mon := monitor.New(monitor.Config{Backend: s, Profile: p, Interval: time.Second, ClearAfter: time.Second})
	node, err := Register(ctx, nodeClient, NodeSpec{Name: "gpu-node-1", GPUs: s.GPUCount(), BootID: "boot-1",
		Labels: AgentLabels("", p.GPU.Driver.Version, p.GPU.Expect.Product, s.GPUCount(), p.GPU.TimeSlicingReplicas(), true)})
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Clientset(t)
	n, err := admin.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b := n.Status.NodeInfo.BootID; b != "boot-1" {
		t.Errorf("nodeInfo.bootID %q, want the machine's boot-1, as kubelet reports it", b)
	}
	if q := n.Status.Capacity["nvidia.com/gpu"]; q.Value() != 8 {
		t.Errorf("nvidia.com/gpu capacity %v, want 8", q.String())
	}
	if n.Labels["gpurack.io/gpu.product"] != "NVIDIA-H100-80GB-HBM3" || n.Labels["gpurack.io/gpu.count"] != "8" || n.Labels["gpurack.io/simulated"] != "true" ||
		n.Labels["nvidia.com/gpu.replicas"] != "1" || n.Labels["nvidia.com/gpu.sharing-strategy"] != "none" {
		t.Errorf("labels %v", n.Labels)
	}
	if len(n.Spec.Taints) == 0 || n.Spec.Taints[0].Key != "gpurack.io/unvalidated" {
		t.Errorf("taints %v", n.Spec.Taints)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go mon.Run(runCtx)
	go Follow(runCtx, node, mon, 10*time.Second, slog.New(slog.DiscardHandler))

	waitCondition := func(want corev1.ConditionStatus, what string) (*corev1.NodeCondition, time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			n, err := admin.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
			if err == nil {
				if c := condition(n, "GPUHealthy"); c != nil && c.Status == want {
					return c, time.Since(start)
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: GPUHealthy never %s", what, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if c, _ := waitCondition(corev1.ConditionTrue, "after validation"); c.Reason != "AllChecksPassed" {
		t.Errorf("GPUHealthy True with reason %q", c.Reason)
	}
	if _, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "gpu-node-1", metav1.GetOptions{}); err != nil {
		t.Errorf("node lease: %v", err)
	}

	allocatable := func() int64 {
		n, err := admin.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q := n.Status.Allocatable["nvidia.com/gpu"]
		return q.Value()
	}
	waitAllocatable := func(want int64, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for allocatable() != want {
			if ctx.Err() != nil {
				t.Fatalf("%s: allocatable nvidia.com/gpu %d, never %d", what, allocatable(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}

	// A lost GPU (XID 79) is withdrawn alone: allocatable 7, GPUHealthy stays True, so
	// gpuboot does not taint the node (decision 0630).
	f, _ := sim.ParseFault("gpu-lost@gpu3")
	injected := time.Now()
	if _, err := s.Inject(f, 0); err != nil {
		t.Fatal(err)
	}
	mon.Kick()
	waitAllocatable(7, "after XID 79 on GPU 3")
	t.Logf("injected GPU loss (XID 79) -> allocatable nvidia.com/gpu 7 in the apiserver after %v", time.Since(injected).Round(time.Millisecond))
	// The condition and allocatable are written by separate updates: wait for the
	// condition's reason too, instead of reading it once.
	for c, _ := waitCondition(corev1.ConditionTrue, "after XID 79"); c.Reason != "GPUsWithdrawn" || !strings.Contains(c.Message, "GPU 3 withdrawn"); c, _ = waitCondition(corev1.ConditionTrue, "after XID 79") {
		if ctx.Err() != nil {
			t.Fatalf("GPUHealthy True reason %q message %q; want GPUsWithdrawn naming GPU 3", c.Reason, c.Message)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Clear()
	mon.GPUsReset([]int{3})
	d := waitAllocatable(8, "after the reset")
	t.Logf("reset -> allocatable 8 again after %v (1 s hysteresis)", d.Round(time.Millisecond))
	if q := func() resource.Quantity {
		n, _ := admin.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
		return n.Status.Capacity["nvidia.com/gpu"]
	}(); q.Value() != 8 {
		t.Errorf("capacity changed to %s; only allocatable follows health", q.String())
	}

	// A whole-node problem (NVLink down) still turns GPUHealthy False: the taint.
	f, _ = sim.ParseFault("nvlink-down:4@gpu1")
	if _, err := s.Inject(f, 0); err != nil {
		t.Fatal(err)
	}
	mon.Kick()
	cond, _ := waitCondition(corev1.ConditionFalse, "after NVLink down")
	if cond.Reason != "NvlinkState" {
		t.Errorf("reason %q, want NvlinkState", cond.Reason)
	}
	s.Clear()
	mon.Kick()
	_, d = waitCondition(corev1.ConditionTrue, "after clearing")
	t.Logf("cleared -> GPUHealthy=True after %v (1 s hysteresis)", d.Round(time.Millisecond))
}

func TestAllocatableGPUs(t *testing.T) {
	at := time.Unix(1, 0)
	fail := func(id checkid.ID, gpu int) checks.Result {
		return checks.Result{ID: id, Status: checks.Fail, GPU: gpu}
	}
	for _, c := range []struct {
		name                string
		s                   health.Summary
		want, wantReplicas4 int
	}{
		{"before the first checklist: as registered", health.NotRun(at), 8, 32},
		{"all healthy", health.Summarize(nil, 8, at), 8, 32},
		{"one GPU withdrawn", health.Summarize([]checks.Result{fail(checkid.ECCUncorrected, 5)}, 8, at), 7, 28},
		{"a tainted node's bad GPU is out too", health.Summarize([]checks.Result{fail(checkid.PCIeLinkWidth, 2), fail(checkid.XIDFatal, 4)}, 8, at), 6, 24},
		{"a GPU missing from NVML", health.Summarize(nil, 7, at), 7, 28},
		{"backend unreadable", health.Summary{State: health.Unhealthy, Reason: "BackendUnavailable"}, 0, 0},
	} {
		for _, replicas := range []int{0, 1} {
			if got := AllocatableGPUs(8, replicas, c.s); got != c.want {
				t.Errorf("%s, replicas %d: %d, want %d", c.name, replicas, got, c.want)
			}
		}
		// Time-slicing: each GPU is 4 devices, and a withdrawn GPU takes all 4.
		if got := AllocatableGPUs(8, 4, c.s); got != c.wantReplicas4 {
			t.Errorf("%s, 4 replicas: %d, want %d", c.name, got, c.wantReplicas4)
		}
	}
}

// TestAgentLabels: a node with GPUs says how they are shared, under GPU feature
// discovery's names; a node without GPUs carries no nvidia.com/ label.
func TestAgentLabels(t *testing.T) {
	for _, c := range []struct {
		count, replicas    int
		replicasL, sharing string
	}{
		{8, 0, "1", "none"},
		{8, 1, "1", "none"},
		{8, 4, "4", "time-slicing"},
		{0, 4, "", ""},
	} {
		l := AgentLabels("img-1", "535.261.03", "NVIDIA H100 80GB HBM3", c.count, c.replicas, false)
		if l["nvidia.com/gpu.replicas"] != c.replicasL || l["nvidia.com/gpu.sharing-strategy"] != c.sharing || l["gpurack.io/gpu.count"] != fmt.Sprint(c.count) {
			t.Errorf("%d GPUs, %d replicas: labels %v", c.count, c.replicas, l)
		}
		if l["gpurack.io/agent"] != "true" {
			t.Errorf("%d GPUs: no gpurack.io/agent=true in %v", c.count, l)
		}
		if c.count == 0 && len(l) != 5 {
			t.Errorf("a node without GPUs: labels %v, want only gpurack.io/ ones", l)
		}
	}
}

// TestSimulatedJoinTimeSlicing: against a real kube-apiserver, a simulated node whose
// profile time-slices 4 ways registers nvidia.com/gpu 32 with the sharing labels; a
// lost GPU takes its 4 replicas out of the allocatable (28), and they come back after
// the reset, the capacity staying 32.
func TestSimulatedJoinTimeSlicing(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p.GPU.Sharing = &profile.Sharing{TimeSlicing: &profile.TimeSlicing{Replicas: 4}}
	s, _ := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "gpu-node-ts"})
	mon := monitor.New(monitor.Config{Backend: s, Profile: p, Interval: time.Second, ClearAfter: time.Second})
	const name = "gpu-node-ts"
	replicas := p.GPU.TimeSlicingReplicas()
	node, err := Register(ctx, admin, NodeSpec{Name: name, GPUs: s.GPUCount(), Replicas: replicas,
		Labels: AgentLabels("", p.GPU.Driver.Version, p.GPU.Expect.Product, s.GPUCount(), replicas, true)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	get := func() *corev1.Node {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := get()
	if q := n.Status.Capacity["nvidia.com/gpu"]; q.Value() != 32 {
		t.Errorf("nvidia.com/gpu capacity %s, want 8 GPUs × 4 replicas = 32", q.String())
	}
	if n.Labels["nvidia.com/gpu.replicas"] != "4" || n.Labels["nvidia.com/gpu.sharing-strategy"] != "time-slicing" || n.Labels["gpurack.io/gpu.count"] != "8" {
		t.Errorf("labels %v", n.Labels)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go mon.Run(runCtx)
	go Follow(runCtx, node, mon, 0, slog.New(slog.DiscardHandler))
	waitAllocatable := func(want int64, what string) {
		t.Helper()
		for {
			q := get().Status.Allocatable["nvidia.com/gpu"]
			if q.Value() == want {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: allocatable nvidia.com/gpu %s, never %d", what, q.String(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAllocatable(32, "as registered")
	f, _ := sim.ParseFault("gpu-lost@gpu3")
	if _, err := s.Inject(f, 0); err != nil {
		t.Fatal(err)
	}
	mon.Kick()
	waitAllocatable(28, "after XID 79 on GPU 3")
	s.Clear()
	mon.GPUsReset([]int{3})
	waitAllocatable(32, "after the reset")
	if q := get().Status.Capacity["nvidia.com/gpu"]; q.Value() != 32 {
		t.Errorf("capacity changed to %s; only allocatable follows health", q.String())
	}
}

// TestGPUHealthyKeepsTransitionTime: lastTransitionTime is when GPUHealthy last changed
// status, as for every Node condition; writing the same status again (a new reason or
// message, or an agent restart) keeps it.
func TestGPUHealthyKeepsTransitionTime(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "gpu-node-ltt"
	n, err := Register(ctx, admin, NodeSpec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	read := func() corev1.NodeCondition {
		t.Helper()
		node, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := condition(node, "GPUHealthy")
		if c == nil {
			t.Fatal("no GPUHealthy condition")
		}
		return *c
	}
	if err := n.SetGPUHealthy(ctx, corev1.ConditionTrue, "AllChecksPassed", "All checks passed on 8 GPUs."); err != nil {
		t.Fatal(err)
	}
	first := read()
	// lastTransitionTime has one-second resolution: let a second pass so that a
	// rewritten time would show.
	time.Sleep(1100 * time.Millisecond)
	if err := n.SetGPUHealthy(ctx, corev1.ConditionTrue, "ChecksWarning", "GPUs usable; 1 check warns."); err != nil {
		t.Fatal(err)
	}
	if got := read(); !got.LastTransitionTime.Equal(&first.LastTransitionTime) || got.Reason != "ChecksWarning" {
		t.Errorf("True again: lastTransitionTime %v reason %s, want %v ChecksWarning", got.LastTransitionTime, got.Reason, first.LastTransitionTime)
	}
	// A restarted agent has a new Node value that has written nothing yet.
	restarted := &Node{Client: admin, Name: name}
	if err := restarted.SetGPUHealthy(ctx, corev1.ConditionTrue, "AllChecksPassed", "All checks passed on 8 GPUs."); err != nil {
		t.Fatal(err)
	}
	if got := read(); !got.LastTransitionTime.Equal(&first.LastTransitionTime) {
		t.Errorf("True after a restart: lastTransitionTime %v, want %v", got.LastTransitionTime, first.LastTransitionTime)
	}
	if err := restarted.SetGPUHealthy(ctx, corev1.ConditionFalse, "XidFatal", "1 of 8 GPUs unhealthy."); err != nil {
		t.Fatal(err)
	}
	if got := read(); !got.LastTransitionTime.After(first.LastTransitionTime.Time) || got.Status != corev1.ConditionFalse {
		t.Errorf("False: lastTransitionTime %v status %s, want after %v and False", got.LastTransitionTime, got.Status, first.LastTransitionTime)
	}
}

// TestEnsureLabelsAfterReimage: a node registered by an earlier boot on image A keeps
// A's labels through Register (as kubelet keeps --node-labels of a Node that exists);
// EnsureLabels, with the node's own credentials, brings the image and driver labels to
// the new boot's, and changes nothing when they already are.
func TestEnsureLabelsAfterReimage(t *testing.T) {
	c := testcluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := Bootstrap(ctx, c.Server, c.CAPEM, c.JoinToken(t), "gpu-reimaged")
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := AgentLabels("image-a", "535.183.01", "NVIDIA H100", 8, 1, true)
	if _, err := Register(ctx, client, NodeSpec{Name: "gpu-reimaged", GPUs: 8, BootID: "boot-1", Labels: before}); err != nil {
		t.Fatal(err)
	}
	after := AgentLabels("image-b", "550.90.07", "NVIDIA H100", 8, 1, true)
	node, err := Register(ctx, client, NodeSpec{Name: "gpu-reimaged", GPUs: 8, BootID: "boot-2", Labels: after})
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Clientset(t)
	n, err := admin.CoreV1().Nodes().Get(ctx, "gpu-reimaged", metav1.GetOptions{})
	if err != nil || n.Labels["gpurack.io/image"] != "image-a" {
		t.Fatalf("before EnsureLabels: %v %v; the test expects Register to keep the earlier boot's labels", n.Labels, err)
	}
	changed, err := node.EnsureLabels(ctx, after)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(changed, []string{"gpurack.io/driver-version", "gpurack.io/image"}) {
		t.Errorf("changed %v, want the driver and the image", changed)
	}
	n, err = admin.CoreV1().Nodes().Get(ctx, "gpu-reimaged", metav1.GetOptions{})
	if err != nil || n.Labels["gpurack.io/image"] != "image-b" || n.Labels["gpurack.io/driver-version"] != "550.90.07" {
		t.Errorf("after EnsureLabels: %v %v", n.Labels, err)
	}
	if changed, err := node.EnsureLabels(ctx, after); err != nil || len(changed) != 0 {
		t.Errorf("a second EnsureLabels changed %v (%v), want nothing", changed, err)
	}
}

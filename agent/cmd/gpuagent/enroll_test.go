package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
)

var (
	gpubootOnce sync.Once
	gpubootBin  string
	gpubootErr  error
)

// buildGpuboot builds the real gpuboot binary once per test run.
func buildGpuboot(t testing.TB) string {
	t.Helper()
	gpubootOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpuboot-bin-")
		if err != nil {
			gpubootErr = err
			return
		}
		gpubootBin = filepath.Join(dir, "gpuboot")
		if out, err := exec.Command("go", "build", "-o", gpubootBin, "github.com/gpurack/gpurack/pxe/cmd/gpuboot").CombinedOutput(); err != nil {
			gpubootErr = fmt.Errorf("go build gpuboot: %v\n%s", err, out)
		}
	})
	if gpubootErr != nil {
		t.Fatal(gpubootErr)
	}
	return gpubootBin
}

// gpubootProc is a running `gpuboot serve` with the files of `gpuboot init`.
type gpubootProc struct {
	t               testing.TB
	bin, dir, cfg   string
	pin, creds, tls string
	log             *syncBuffer
	cmd             *exec.Cmd
}

func (g *gpubootProc) run(args ...string) string {
	g.t.Helper()
	out, err := exec.Command(g.bin, args...).CombinedOutput()
	if err != nil {
		g.t.Fatalf("gpuboot %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cli runs an operator command with the operator credentials `gpuboot init` wrote.
func (g *gpubootProc) cli(args ...string) string {
	g.t.Helper()
	return g.run(append(args, "--server", g.tls, "--credentials", g.creds)...)
}

// startGpuboot runs `gpuboot init` and `gpuboot serve` with the cluster's enroller
// kubeconfig, on loopback, without DHCP and TFTP.
func startGpuboot(t testing.TB, c *testcluster.Cluster) *gpubootProc {
	t.Helper()
	return startGpubootWith(t, "enrollment: {allowSimulated: true}\ncluster: {kubeconfig: "+c.EnrollerKubeconfig+"}\n")
}

// startGpubootWith is startGpuboot with extra configuration lines (enrollment, policy,
// cluster) instead of the cluster's.
func startGpubootWith(t testing.TB, extra string) *gpubootProc {
	t.Helper()
	g := &gpubootProc{t: t, bin: buildGpuboot(t), dir: t.TempDir(), log: &syncBuffer{}}
	out := g.run("init", "--state-dir", filepath.Join(g.dir, "state"), "--advertise", "127.0.0.1", "--rack", "r1")
	for _, line := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(line, "CA pin (gpurack.enroll.ca): "); ok {
			g.pin = p
		}
	}
	if g.pin == "" {
		t.Fatalf("gpuboot init printed no CA pin:\n%s", out)
	}
	g.creds = filepath.Join(g.dir, "state", "operators", "admin")
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(pub)
	os.WriteFile(filepath.Join(g.dir, "images.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	os.MkdirAll(filepath.Join(g.dir, "images"), 0o755)
	g.tls = freePort(t)
	g.cfg = filepath.Join(g.dir, "gpuboot.yaml")
	cfg := fmt.Sprintf(`stateDir: state
advertise: 127.0.0.1
listen: {http: "%s", tls: "%s"}
images: {store: images, trustedKeys: [images.pub]}
racks: [{name: r1, defaultImage: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}]
dhcp: {enabled: false}
tftp: {enabled: false}
logLevel: info
%s`, freePort(t), g.tls, extra)
	if err := os.WriteFile(g.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	g.cmd = exec.Command(g.bin, "serve", "--config", g.cfg)
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := g.cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("gpuboot log:\n%s", g.log.String())
		}
	})
	return g
}

// e2eFactsRoot is a fake / with the identity files the agent reads.
func e2eFactsRoot(t testing.TB, mac, serial string) string {
	t.Helper()
	root := t.TempDir()
	dmi := filepath.Join(root, "sys/class/dmi/id")
	os.MkdirAll(dmi, 0o755)
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	os.WriteFile(filepath.Join(dmi, "product_serial"), []byte(serial+"\n"), 0o644)
	os.WriteFile(filepath.Join(dmi, "product_uuid"), []byte("4C4C4544-0042-3510-8052-B4C04F4E3232\n"), 0o644)
	os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("console=ttyS0 BOOTIF=01-"+strings.ReplaceAll(mac, ":", "-")+" quiet\n"), 0o644)
	return root
}

// enrolled is a simulated agent that enrolled with a real gpuboot and is ready.
type enrolled struct {
	g      *gpubootProc
	agent  *agentProc
	node   string
	admin  kubernetes.Interface // not rate limited
	nodeOf func() *corev1.Node
	local  agentv1.AgentServiceClient // unix socket
	remote agentv1.AgentServiceClient // TCP, mTLS with the bundle's certificate
	ctx    context.Context
	args   []string // the agent's flags, to restart it
}

// enrollToReady runs the real gpuboot binary with the enroller kubeconfig of a real
// control plane and a simulated agent started with --enroll/--enroll-ca, and takes the
// machine through Register → "waiting for approval" → `gpuboot machines approve` →
// GetJoinBundle → TLS bootstrap join → Node with nvidia.com/gpu: 8 → commissioning
// report → ready, with gpurack.io/unvalidated removed by gpuboot's node controller.
//
// extra flags are added to the agent's.
func enrollToReady(t testing.TB, mac, node string, extra ...string) *enrolled {
	t.Helper()
	c := testcluster.Shared(t)
	// Not rate limited: client-go's default of 5 requests/s would dominate the
	// latencies the benchmarks measure.
	adminCfg := c.RESTConfig(t)
	adminCfg.QPS, adminCfg.Burst = 1000, 1000
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		t.Fatal(err)
	}
	g := startGpuboot(t, c)
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	listen := freePort(t)
	// The console is a terminal the agent appends to; a file stands in for it.
	if err := os.WriteFile(filepath.Join(dir, "console"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--gpu-backend", "sim:dgxh100", "--profile", h100Profile,
		"--enroll", g.tls, "--enroll-ca", g.pin, "--key-dir", filepath.Join(dir, "run"),
		"--facts-root", e2eFactsRoot(t, mac, "SN-"+strings.ReplaceAll(mac, ":", "")),
		"--listen", listen, "--metrics-listen", "", "--socket", sock, "--interval", "1s", "--clear-after", "1s",
		"--console", filepath.Join(dir, "console")}
	args = append(args, extra...)
	d := startDaemon(t, nil, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)

	waitUntil(t, 60*time.Second, "agent socket", func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e := &enrolled{g: g, agent: d, node: node, admin: admin, local: agentv1.NewAgentServiceClient(conn), ctx: ctx, args: args}
	waitUntil(t, 90*time.Second, "waiting for approval", func() bool {
		st := e.enrollment()
		return st.GetState() == agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL && strings.Contains(st.GetMessage(), "waiting for approval")
	})
	if st := e.enrollment(); !strings.HasPrefix(st.GetKeyFingerprint(), "sha256:") || st.GetEndpoint() != g.tls {
		t.Errorf("enrollment status %v", st)
	}
	// Whoever watches the machine's console sees the wait and the key to approve.
	if con, _ := os.ReadFile(filepath.Join(dir, "console")); !strings.Contains(string(con), "gpuagent: waiting for approval") || !strings.Contains(string(con), "key sha256:") {
		t.Errorf("console lacks the waiting-for-approval line with the key:\n%s", con)
	}
	// The pre-approval facts and checklist reach gpuboot before anyone approves.
	waitUntil(t, 30*time.Second, "machine registered in gpuboot", func() bool {
		return strings.Contains(g.cli("machines", "show", mac), "registered")
	})
	g.cli("machines", "approve", mac, "--reason", "agent e2e", "--node-name", node)

	e.nodeOf = func() *corev1.Node {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return n
	}
	waitUntil(t, 90*time.Second, "Node "+node, func() bool { return e.nodeOf() != nil })
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	// The Node is created first and its status (capacity) patched right after.
	waitUntil(t, 30*time.Second, "nvidia.com/gpu: 8 on the Node", func() bool {
		q := e.nodeOf().Status.Capacity["nvidia.com/gpu"]
		return q.Value() == 8
	})
	waitUntil(t, 60*time.Second, "machine ready and gpurack.io/unvalidated removed", func() bool {
		n := e.nodeOf()
		return n != nil && !hasTaint(n, "gpurack.io/unvalidated") && e.enrollment().GetMachineState() == "ready"
	})
	// The agent's TCP listener serves mutual TLS with the certificate gpuboot issued for
	// the agent's own key; gpuboot's operator certificate (same gpurack CA) is accepted.
	e.remote = agentv1.NewAgentServiceClient(operatorConn(t, g.creds, listen, node))
	return e
}

func (e *enrolled) enrollment() *agentv1.EnrollmentStatus {
	st, err := e.local.Status(e.ctx, &agentv1.StatusRequest{})
	if err != nil {
		return nil
	}
	return st.GetEnrollment()
}

// TestEnrollWithGpuboot is the whole path with real parts (enrollToReady), then health:
// XID 79 → GPUHealthy=False → gpuboot sets gpurack.io/gpu-unhealthy; clear → the taint
// is removed once the agent's hysteresis (--clear-after) has passed.
func TestEnrollWithGpuboot(t *testing.T) {
	e := enrollToReady(t, "52:54:00:e2:e0:01", "gpu-r1-e2e")
	ctx := e.ctx
	if st := e.enrollment(); st.GetState() != agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED {
		t.Errorf("enrollment after commissioning: %v", st)
	}
	if out := e.g.cli("machines", "show", e.node); !strings.Contains(out, "ready") {
		t.Errorf("gpuboot machines show %s:\n%s", e.node, out)
	}
	if st, err := e.remote.Status(ctx, &agentv1.StatusRequest{}); err != nil {
		t.Fatalf("Status over mTLS with the bundle's certificate: %v", err)
	} else if st.GetNodeName() != e.node {
		t.Errorf("node name over mTLS: %q", st.GetNodeName())
	}
	n := e.nodeOf()
	if n.Labels["gpurack.io/gpu.count"] != "8" || n.Labels["gpurack.io/simulated"] != "true" {
		t.Errorf("labels %v", n.Labels)
	}
	// Simulation is visible on gpuboot's side too (CONTRACTS §11): the commissioning
	// report says simulated, the move to ready says so, and gpuboot warned at start
	// that its config lets simulated machines be ready.
	var sm bootv1.Machine
	if err := protojson.Unmarshal([]byte(e.g.cli("machines", "show", e.node, "-o", "json")), &sm); err != nil {
		t.Fatal(err)
	}
	if !sm.GetChecklist().GetSimulated() {
		t.Errorf("gpuboot's stored checklist is not marked simulated")
	}
	if !slices.ContainsFunc(sm.GetHistory(), func(tr *bootv1.Transition) bool {
		return tr.GetTo() == bootv1.MachineState_MACHINE_STATE_READY && strings.Contains(tr.GetReason(), "simulated")
	}) {
		t.Errorf("history %v; want a move to ready whose reason names simulation", sm.GetHistory())
	}
	if !strings.Contains(e.g.log.String(), "enrollment.allowSimulated is on") {
		t.Errorf("gpuboot did not warn that simulated machines can be ready:\n%s", e.g.log.String())
	}

	// XID 79 on one GPU withdraws that GPU: one less allocatable, no taint (decision 0630).
	t0 := time.Now()
	if _, err := e.remote.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "allocatable nvidia.com/gpu 7", func() bool { n := e.nodeOf(); return n != nil && withdrawnOne(n) })
	t.Logf("InjectFault xid:79@gpu3 -> allocatable nvidia.com/gpu 7 visible in the apiserver after %v (200 ms polling)", time.Since(t0).Round(time.Millisecond))
	// The agent writes the allocatable count, then the condition (two updates, a few
	// milliseconds apart): the test waits for the second, and the node is never tainted.
	waitUntil(t, 10*time.Second, "GPUHealthy True/GPUsWithdrawn", func() bool {
		s, r := gpuHealthyOf(e.nodeOf())
		return s == "True" && r == "GPUsWithdrawn"
	})
	if n := e.nodeOf(); hasTaint(n, "gpurack.io/gpu-unhealthy") {
		t.Errorf("one withdrawn GPU tainted the node: %v", n.Spec.Taints)
	}
	if _, err := e.remote.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "allocatable 8 again", func() bool { n := e.nodeOf(); return n != nil && allGPUs(n) })
	if n := e.nodeOf(); hasTaint(n, "gpurack.io/gpu-unhealthy") {
		t.Error("a withdrawn GPU tainted the node")
	}

	// A whole-node problem (NVLink links down) taints it.
	t0 = time.Now()
	if _, err := e.remote.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "nvlink-down:4@gpu1"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "gpurack.io/gpu-unhealthy taint", func() bool { n := e.nodeOf(); return n != nil && hasTaint(n, "gpurack.io/gpu-unhealthy") })
	t.Logf("InjectFault nvlink-down:4@gpu1 -> gpurack.io/gpu-unhealthy taint visible in the apiserver after %v (200 ms polling)", time.Since(t0).Round(time.Millisecond))
	if s, r := gpuHealthyOf(e.nodeOf()); s != "False" || r != "NvlinkState" {
		t.Errorf("GPUHealthy %s/%s, want False/NvlinkState", s, r)
	}
	// The health change went to gpuboot at once in a heartbeat (mutual TLS).
	waitUntil(t, 30*time.Second, "gpuboot holds the unhealthy heartbeat", func() bool {
		var m bootv1.Machine
		if err := protojson.Unmarshal([]byte(e.g.cli("machines", "show", e.node, "-o", "json")), &m); err != nil {
			t.Fatal(err)
		}
		h := m.GetHealth()
		return m.GetLastHeartbeatAt() != nil && !h.GetGpuHealthy() && slices.Contains(h.GetFailingCheckIds(), "gpu.nvlink.state")
	})
	t1 := time.Now()
	if _, err := e.remote.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "gpu-unhealthy taint removed", func() bool { n := e.nodeOf(); return n != nil && !hasTaint(n, "gpurack.io/gpu-unhealthy") })
	t.Logf("ClearFaults -> taint removed after %v (the agent's 1 s hysteresis)", time.Since(t1).Round(time.Millisecond))
	if s, _ := gpuHealthyOf(e.nodeOf()); s != "True" {
		t.Errorf("GPUHealthy %s after clearing", s)
	}
	e.agent.stop(t)

	// systemd restarts the agent (same boot, same key in /run/gpurack): gpuboot does not
	// release the bundle twice, so the agent carries on with the one it kept, with no
	// operator involved.
	d2 := startDaemon(t, nil, e.args...)
	waitUntil(t, 90*time.Second, "restarted agent joined again", func() bool {
		st := e.enrollment()
		return st.GetState() == agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED && st.GetMachineState() == "ready"
	})
	if log := d2.stderr.String(); !strings.Contains(log, "JoinBundle kept from before a restart") || strings.Contains(log, "waiting for approval") ||
		!strings.Contains(log, "using the node credentials kept from before a restart") {
		t.Errorf("restarted agent did not use its kept bundle:\n%s", log)
	}
	if st, err := e.remote.Status(ctx, &agentv1.StatusRequest{}); err != nil || st.GetNodeName() != e.node {
		t.Errorf("Status over mTLS after the restart: %v %v", st.GetNodeName(), err)
	}
	d2.stop(t)
}

// Fault-to-taint benchmarks. Conditions: one simulated 8-GPU agent process (sim:dgxh100,
// --interval 1s, --clear-after 1s) enrolled with the real gpuboot binary, whose node
// controller uses the enroller kubeconfig of the shared test control plane
// (controlplane-bootstrap/testcluster: real kube-apiserver and etcd on loopback);
// everything on one host. The clock stops when the taint is visible to a watch on the
// Node (no polling, and a client without client-go's 5 requests/s limit). Each
// iteration then clears the fault and waits for the taint to go, untimed.
//
// BenchmarkFaultToTaint: gRPC InjectFault nvlink-down:4@gpu1 (a whole-node problem)
// over mutual TLS → the simulator → the agent's checklist (kicked by the fault) →
// GPUHealthy=False patch → gpuboot's node controller → gpurack.io/gpu-unhealthy.
func BenchmarkFaultToTaint(b *testing.B) {
	e := enrollToReady(b, "52:54:00:e2:e0:02", "gpu-r1-bench")
	nw := newNodeWatcher(b, e.ctx, e.admin, e.node)
	for b.Loop() {
		if _, err := e.remote.InjectFault(e.ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "nvlink-down:4@gpu1"}}); err != nil {
			b.Fatal(err)
		}
		nw.until(b, "gpu-unhealthy taint", tainted)
		b.StopTimer()
		e.clear(b, nw, func(n *corev1.Node) bool { return !tainted(n) })
		b.StartTimer()
	}
}

// BenchmarkFaultToWithdrawn: gRPC InjectFault xid:79@gpu3 over mutual TLS → the
// simulator puts XID 79 on its NVML event sets → the agent's NVML event watch →
// checklist → GPU 3 withdrawn → the simulated Node's allocatable nvidia.com/gpu 7.
func BenchmarkFaultToWithdrawn(b *testing.B) {
	e := enrollToReady(b, "52:54:00:e2:e0:04", "gpu-r1-withdraw")
	nw := newNodeWatcher(b, e.ctx, e.admin, e.node)
	for b.Loop() {
		if _, err := e.remote.InjectFault(e.ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
			b.Fatal(err)
		}
		nw.until(b, "allocatable nvidia.com/gpu 7", withdrawnOne)
		b.StopTimer()
		e.clear(b, nw, allGPUs)
		b.StartTimer()
	}
}

// BenchmarkKmsgXIDToWithdrawn: an NVRM Xid 79 record in /dev/kmsg's format
// ("PRIO,SEQ,USEC,FLAGS;NVRM: Xid (PCI:…): 79, …") written to a FIFO that stands in for
// /dev/kmsg (--kmsg FIFO) → the agent's kernel log reader and parser (xid.WatchKmsg,
// ParseKmsg) → PCI bus to GPU → checklist → GPU 3 withdrawn → allocatable 7.
func BenchmarkKmsgXIDToWithdrawn(b *testing.B) {
	fifo := filepath.Join(b.TempDir(), "kmsg")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		b.Fatal(err)
	}
	// Held open for writing for the whole run: a FIFO without a writer reads as end of
	// file, which ends the agent's watch.
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	e := enrollToReady(b, "52:54:00:e2:e0:03", "gpu-r1-kmsg", "--kmsg", fifo)
	gpus, err := e.remote.ListGPUs(e.ctx, &agentv1.ListGPUsRequest{})
	if err != nil || len(gpus.GetGpus()) < 4 {
		b.Fatalf("ListGPUs: %v", err)
	}
	// The kernel writes the bus id as DOMAIN:BUS:DEVICE in lower case.
	bus := strings.ToLower(strings.TrimSuffix(gpus.GetGpus()[3].GetGpu().GetPciBusId(), ".0"))[4:]
	nw := newNodeWatcher(b, e.ctx, e.admin, e.node)
	var seq uint64
	for b.Loop() {
		seq++
		line := fmt.Sprintf("3,%d,%d,-;NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n", seq, monotonicMicros(), bus)
		if _, err := w.WriteString(line); err != nil {
			b.Fatal(err)
		}
		nw.until(b, "allocatable nvidia.com/gpu 7", withdrawnOne)
		b.StopTimer()
		e.clear(b, nw, allGPUs)
		b.StartTimer()
	}
}

func tainted(n *corev1.Node) bool { return hasTaint(n, "gpurack.io/gpu-unhealthy") }

// withdrawnOne: the Node advertises one GPU less than its capacity.
func withdrawnOne(n *corev1.Node) bool {
	a, c := n.Status.Allocatable["nvidia.com/gpu"], n.Status.Capacity["nvidia.com/gpu"]
	return a.Value() == c.Value()-1
}

// allGPUs: every GPU of the Node is allocatable.
func allGPUs(n *corev1.Node) bool {
	a, c := n.Status.Allocatable["nvidia.com/gpu"], n.Status.Capacity["nvidia.com/gpu"]
	return c.Value() > 0 && a.Value() == c.Value()
}

// clear clears the simulator's faults (a reset of the simulated GPUs, so their XIDs
// stop counting) and waits until done says the Node recovered.
func (e *enrolled) clear(b *testing.B, nw *nodeWatcher, done func(*corev1.Node) bool) {
	if _, err := e.remote.ClearFaults(e.ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		b.Fatal(err)
	}
	nw.until(b, "recovery after ClearFaults", done)
}

// monotonicMicros is CLOCK_MONOTONIC in microseconds, the kmsg timestamp.
func monotonicMicros() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() / 1000
}

// nodeWatcher follows one Node through a watch.
type nodeWatcher struct {
	ctx    context.Context
	client kubernetes.Interface
	name   string
	w      watch.Interface
	last   *corev1.Node
}

func newNodeWatcher(tb testing.TB, ctx context.Context, client kubernetes.Interface, name string) *nodeWatcher {
	nw := &nodeWatcher{ctx: ctx, client: client, name: name}
	nw.rewatch(tb)
	tb.Cleanup(func() { nw.w.Stop() })
	return nw
}

// rewatch reads the Node and watches it from there.
func (nw *nodeWatcher) rewatch(tb testing.TB) {
	n, err := nw.client.CoreV1().Nodes().Get(nw.ctx, nw.name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	if nw.w != nil {
		nw.w.Stop()
	}
	nw.last = n
	nw.w, err = nw.client.CoreV1().Nodes().Watch(nw.ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + nw.name, ResourceVersion: n.ResourceVersion})
	if err != nil {
		tb.Fatal(err)
	}
}

// until returns once the Node satisfies cond (at once if it already does).
func (nw *nodeWatcher) until(tb testing.TB, what string, cond func(*corev1.Node) bool) {
	deadline := time.After(60 * time.Second)
	for !cond(nw.last) {
		select {
		case ev, ok := <-nw.w.ResultChan():
			if !ok {
				nw.rewatch(tb) // the apiserver ends watches now and then
				continue
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode && ev.Type != watch.Deleted {
				nw.last = n
			}
		case <-deadline:
			tb.Fatalf("%s: not seen within 60 s", what)
		}
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func gpuHealthyOf(n *corev1.Node) (string, string) {
	if n == nil {
		return "", ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "GPUHealthy" {
			return string(c.Status), c.Reason
		}
	}
	return "", ""
}

// operatorConn dials the agent at addr with mutual TLS: gpuboot's operator certificate
// as client, the gpurack CA as root, serverName the node name (the agent certificate's
// DNS SAN).
func operatorConn(t testing.TB, credsDir, addr, serverName string) *grpc.ClientConn {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(credsDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	kp, err := pki.LoadKeyPair(filepath.Join(credsDir, "operator.crt"), filepath.Join(credsDir, "operator.key"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, Certificates: []tls.Certificate{kp.TLSCertificate()}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestEnrollNeedsPin: an enrollment endpoint without a CA pin is refused at start
// (exit 2) rather than trusting whoever answers.
func TestEnrollNeedsPin(t *testing.T) {
	dir := t.TempDir()
	_, stderr, code := runAgent(t, "run", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--enroll", "127.0.0.1:1",
		"--listen", "", "--metrics-listen", "", "--socket", filepath.Join(dir, "agent.sock"), "--key-dir", dir)
	if code != 2 || !strings.Contains(stderr, "no CA pin") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

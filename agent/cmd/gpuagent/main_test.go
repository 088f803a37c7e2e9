package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/gpurack/gpurack/agent/kubejoin"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The test binary doubles as gpuagent: with GPUAGENT_TEST_MAIN=1 it runs main, so the
// tests exercise the real command line, exit codes and signals without a second build.
func TestMain(m *testing.M) {
	if os.Getenv("GPUAGENT_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(testcluster.Main(m))
}

const (
	h100Profile = "../../../profiles/debian12-nvidia535.yaml"
	tinyProfile = "../../../profiles/tiny.yaml"
)

func agentCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GPUAGENT_TEST_MAIN=1")
	return cmd
}

// runAgent runs gpuagent to completion and returns stdout, stderr and the exit code.
func runAgent(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := agentCmd(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestValidateNVMLWithoutDriver(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		testreq.NotApplicable(t, "this machine has an NVIDIA driver; the no-driver path cannot be tested here")
	}
	out, stderr, code := runAgent(t, "validate", "--gpu-backend", "nvml", "--profile", h100Profile, "--kmsg", "off")
	if code != 2 {
		t.Fatalf("exit %d, want 2 (cannot run)\nstdout:\n%s\nstderr:\n%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "NVML not available") || strings.Contains(stderr, "symbol lookup") || strings.Contains(stderr, "panic") {
		t.Errorf("stderr does not explain cleanly:\n%s", stderr)
	}
	if !strings.Contains(out, "FAIL            gpu.driver.loaded") {
		t.Errorf("checklist does not show gpu.driver.loaded failing:\n%s", out)
	}
	// A profile without GPUs needs no driver: everything is not-applicable, exit 0.
	out, stderr, code = runAgent(t, "validate", "--gpu-backend", "nvml", "--profile", tinyProfile, "--kmsg", "off")
	if code != 0 || !strings.Contains(out, "overall: NOT-APPLICABLE") {
		t.Errorf("tiny profile: exit %d\n%s%s", code, out, stderr)
	}
}

// simGPUProfile writes the tiny profile with a gpu section whose GPUs are the
// simulator's dgxh100 (gpu.simulator): a simulated GPU image's profile.
func simGPUProfile(t *testing.T) string {
	t.Helper()
	tiny, err := os.ReadFile(tinyProfile)
	if err != nil {
		t.Fatal(err)
	}
	src := string(tiny) + `gpu:
  vendor: nvidia
  simulator: dgxh100
  expect: {count: 8, product: NVIDIA H100 80GB HBM3, memoryMiB: 81559, pcie: {gen: 5, width: 16}, nvlinkLinks: 18}
`
	path := filepath.Join(t.TempDir(), "tiny-sim.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A simulated GPU image's profile (gpu.simulator) picks the simulator backend without
// --gpu-backend: every check runs against the 8 simulated GPUs and passes (the driver
// check pins none), and the checklist says simulated. --gpu-backend still wins.
func TestValidateSimulatedGPUProfile(t *testing.T) {
	prof := simGPUProfile(t)
	out, stderr, code := runAgent(t, "validate", "--profile", prof, "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, stderr)
	}
	var cl machinev1.Checklist
	if err := protojson.Unmarshal([]byte(out), &cl); err != nil {
		t.Fatalf("--format json is not a protojson Checklist: %v\n%s", err, out)
	}
	if cl.Overall != machinev1.CheckStatus_CHECK_STATUS_PASS || !cl.Simulated {
		t.Errorf("checklist overall %s simulated %v, want PASS and simulated", cl.Overall, cl.Simulated)
	}
	gpus, statuses := map[int32]bool{}, map[string]machinev1.CheckStatus{}
	for _, r := range cl.Results {
		if r.GpuIndex != nil {
			gpus[*r.GpuIndex] = true
		} else {
			statuses[r.Id] = r.Status
		}
	}
	for _, id := range []string{"gpu.count", "gpu.driver.version"} {
		if statuses[id] != machinev1.CheckStatus_CHECK_STATUS_PASS {
			t.Errorf("%s: %s, want PASS (the simulator's GPUs against the profile's expect)", id, statuses[id])
		}
	}
	if len(gpus) != 8 {
		t.Errorf("per-GPU results for %d GPUs, want the simulator's 8", len(gpus))
	}
	// --gpu-backend nvml overrides the profile: no driver here, so it cannot run.
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		if _, stderr, code := runAgent(t, "validate", "--gpu-backend", "nvml", "--profile", prof, "--kmsg", "off"); code != 2 || !strings.Contains(stderr, "NVML not available") {
			t.Errorf("--gpu-backend nvml with a simulated profile: exit %d, want 2 (NVML not available)\n%s", code, stderr)
		}
	}
}

func TestValidateSimulator(t *testing.T) {
	out, stderr, code := runAgent(t, "validate", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile)
	if code != 0 || !strings.Contains(out, "overall: PASS") {
		t.Fatalf("healthy sim: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = runAgent(t, "validate", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile,
		"--fault", "xid:79@gpu3", "--fault", "pcie-width:8@gpu1", "--fault", "temperature:80@gpu5", "--format", "json")
	if code != 1 {
		t.Fatalf("faulty sim: exit %d, want 1\n%s", code, stderr)
	}
	var cl machinev1.Checklist
	if err := protojson.Unmarshal([]byte(out), &cl); err != nil {
		t.Fatalf("--format json is not a protojson Checklist: %v\n%s", err, out)
	}
	if cl.Overall != machinev1.CheckStatus_CHECK_STATUS_FAIL || cl.Profile != "debian12-nvidia535" || cl.DriverVersion != "535.261.03" {
		t.Errorf("checklist overall %s profile %s driver %s", cl.Overall, cl.Profile, cl.DriverVersion)
	}
	want := map[string]machinev1.CheckStatus{"gpu.xid.fatal/3": machinev1.CheckStatus_CHECK_STATUS_FAIL,
		"gpu.pcie.link-width/1": machinev1.CheckStatus_CHECK_STATUS_FAIL, "gpu.temperature/5": machinev1.CheckStatus_CHECK_STATUS_WARN}
	for _, r := range cl.Results {
		if r.GpuIndex == nil {
			continue
		}
		key := fmt.Sprintf("%s/%d", r.Id, r.GetGpuIndex())
		if w, ok := want[key]; ok {
			if r.Status != w || r.Remedy == "" {
				t.Errorf("%s = %s remedy %q, want %s", key, r.Status, r.Remedy, w)
			}
			delete(want, key)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing results %v", want)
	}
	out, _, code = runAgent(t, "validate", "--gpu-backend", "sim:dgxa100", "--profile", h100Profile, "--format", "md")
	if code != 1 || !strings.Contains(out, "| fail | `gpu.product` |") {
		t.Errorf("A100 sim against an H100 profile: exit %d\n%s", code, out)
	}
}

func TestValidateCannotRun(t *testing.T) {
	for _, args := range [][]string{
		{"--profile", filepath.Join(t.TempDir(), "missing.json")},
		{"--profile", h100Profile, "--format", "xml"},
		{"--profile", h100Profile, "--gpu-backend", "sim:nope"},
		{"--profile", h100Profile, "--gpu-backend", "sim:dgxh100", "--fault", "xid:79"},
		{"--profile", h100Profile, "--gpu-backend", "nvml", "--fault", "xid:79@gpu0"},
	} {
		_, stderr, code := runAgent(t, append([]string{"validate"}, args...)...)
		if code != 2 || !strings.HasPrefix(stderr, "gpuagent: ") {
			t.Errorf("validate %v: exit %d, stderr %q; want 2 and a message", args, code, stderr)
		}
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// daemon is a running `gpuagent run`.
type agentProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func startDaemon(t testing.TB, env []string, args ...string) *agentProc {
	t.Helper()
	return startDaemonFrom(t, os.Args[0], env, args...)
}

// startDaemonFrom is startDaemon with the agent run from bin, a copy of the test binary.
func startDaemonFrom(t testing.TB, bin string, env []string, args ...string) *agentProc {
	t.Helper()
	cmd := agentCmd(context.Background(), append([]string{"run"}, args...)...)
	cmd.Path, cmd.Args[0] = bin, bin
	cmd.Env = append(cmd.Env, env...)
	d := &agentProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", d.stderr.String())
		}
	})
	return d
}

func (d *agentProc) stop(t testing.TB) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("agent exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop within 20 s of SIGTERM")
	}
}

// TestRunNotifiesSystemd checks Type=notify: READY=1 after start, WATCHDOG=1 while
// the check loop runs, STOPPING=1 on SIGTERM, through a fake NOTIFY_SOCKET (PID 1 here
// is not systemd).
func TestRunNotifiesSystemd(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	d := startDaemon(t, []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=400000"},
		"--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", "", "--metrics-listen", "",
		"--socket", filepath.Join(dir, "agent.sock"), "--interval", "200ms")
	seen := map[string]bool{}
	buf := make([]byte, 4096)
	deadline := time.Now().Add(30 * time.Second)
	for !(seen["READY=1"] && seen["WATCHDOG=1"]) {
		conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("notifications so far %v: %v", seen, err)
		}
		for _, l := range strings.Split(string(buf[:n]), "\n") {
			seen[l] = true
		}
	}
	d.stop(t)
	for {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no STOPPING=1 after SIGTERM; got %v", seen)
		}
		if strings.Contains(string(buf[:n]), "STOPPING=1") {
			break
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "agent.sock")); !os.IsNotExist(err) {
		t.Errorf("local socket left behind: %v", err)
	}
}

// TestRunRecordsStartupXID: `gpuagent run --fault xid:79@gpu3` is a node whose GPU 3
// emitted XID 79 before the agent started. The simulator emits it before any NVML event
// watch exists, so the agent must take it into its XID history at start (as a real node
// finds it in the kernel log); its first checklist then fails gpu.xid.fatal on GPU 3.
// Before the fix the event was lost and the node commissioned as healthy.
func TestRunRecordsStartupXID(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", "", "--metrics-listen", "",
		"--socket", sock, "--interval", "1s", "--fault", "xid:79@gpu3")
	waitUntil(t, 60*time.Second, "agent socket", func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	var h *machinev1.HealthSummary
	waitUntil(t, 60*time.Second, "a health summary", func() bool {
		st, err := c.Status(t.Context(), &agentv1.StatusRequest{})
		h = st.GetHealth()
		return err == nil && h.GetGpuCount() == 8
	})
	if !slices.Contains(h.GetFailingCheckIds(), "gpu.xid.fatal") || !slices.Equal(h.GetUnhealthyGpuIndexes(), []int32{3}) {
		t.Fatalf("health after a start with XID 79 on GPU 3 = %v; want gpu.xid.fatal failing on GPU 3 alone", h)
	}
}

// pkiFixture writes a gpurack CA, an agent certificate and key, an operator client
// certificate, and a JoinBundle.
type pkiFixture struct {
	dir, bundle, caPEM, opCert, opKey, node string
	ca                                      *pki.CA
	op                                      *pki.KeyPair
}

func newPKI(t *testing.T, node string, gossipSeeds []string, mutate ...func(*bootv1.JoinBundle)) *pkiFixture {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.IssueAgent(ca, node, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	op, err := pki.IssueOperator(ca, "alice")
	if err != nil {
		t.Fatal(err)
	}
	f := &pkiFixture{dir: dir, ca: ca, op: op, node: node, caPEM: filepath.Join(dir, "ca.pem"), opCert: filepath.Join(dir, "op.pem"), opKey: filepath.Join(dir, "op.key")}
	agentKey := filepath.Join(dir, "agent.key")
	if err := pki.SaveKeyPair(filepath.Join(dir, "agent.pem"), agentKey, agent); err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveKeyPair(f.opCert, f.opKey, op); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f.caPEM, pki.EncodeCertPEM(ca.Cert), 0o644)
	b := &bootv1.JoinBundle{NodeName: node, AgentCertificatePem: string(pki.EncodeCertPEM(agent.Cert)), AgentKeyRef: "file:" + agentKey,
		GpurackCaPem: string(pki.EncodeCertPEM(ca.Cert)), ImageId: "0123456789abcdef0123456789abcdef01234567",
		IssuedAt: timestamppb.Now(), ExpiresAt: timestamppb.New(time.Now().Add(15 * time.Minute)),
		Gossip: &bootv1.GossipConfig{Key: []byte("0123456789abcdef"), Rack: "rack-t", Seeds: gossipSeeds}}
	for _, m := range mutate {
		m(b)
	}
	data, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	f.bundle = filepath.Join(dir, "bundle.json")
	os.WriteFile(f.bundle, data, 0o600)
	return f
}

func (f *pkiFixture) client(t *testing.T, addr string, withCert bool) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(f.ca.Cert)
	conf := &tls.Config{RootCAs: pool, ServerName: f.node}
	if withCert {
		conf.Certificates = []tls.Certificate{f.op.TLSCertificate()}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestRunServesMTLS runs the simulated agent with a JoinBundle: mTLS gRPC, events,
// fault injection, hysteresis, metrics, grpcurl and gossip.
func TestRunServesMTLS(t *testing.T) {
	listen, metrics, gossipAddr := freePort(t), freePort(t), freePort(t)
	fx := newPKI(t, "node-a", nil)
	d := startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--join-bundle", fx.bundle,
		"--listen", listen, "--metrics-listen", metrics, "--metrics-plaintext", "--socket", filepath.Join(fx.dir, "agent.sock"),
		"--gossip-bind", gossipAddr, "--gossip-local", "--interval", "1s", "--clear-after", "1s", "--log-format", "json")
	conn := fx.client(t, listen, true)
	c := agentv1.NewAgentServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var st *agentv1.StatusResponse
	for {
		var err error
		st, err = c.Status(ctx, &agentv1.StatusRequest{})
		if err == nil && st.GetHealth().GetState() == machinev1.HealthState_HEALTH_STATE_HEALTHY {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never healthy over mTLS: %v %v", err, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.NodeName != "node-a" || !st.Simulated || st.Backend != "sim:dgxh100" || st.DriverVersion != "535.261.03" ||
		st.GetRack().GetRack() != "rack-t" || len(st.GetRack().GetMembers()) != 1 || !st.GetRack().GetMembers()[0].Self {
		t.Errorf("status: %v", st)
	}
	// Without a client certificate the handshake fails.
	if _, err := agentv1.NewAgentServiceClient(fx.client(t, listen, false)).Status(ctx, &agentv1.StatusRequest{}); err == nil {
		t.Error("a client without a certificate was served")
	}

	watch, err := c.WatchEvents(ctx, &agentv1.WatchEventsRequest{Kinds: []agentv1.EventKind{agentv1.EventKind_EVENT_KIND_HEALTH, agentv1.EventKind_EVENT_KIND_XID}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let the stream subscribe
	t0 := time.Now()
	if _, err := c.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
		t.Fatal(err)
	}
	var seq uint64
	// The XID event and the health change it causes both come, in either order: the
	// XID watcher and the checklist publish on their own.
	var sawXID, sawWithdrawn bool
	for !sawXID || !sawWithdrawn {
		ev, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Sequence != seq+1 {
			t.Errorf("sequence %d after %d", ev.Sequence, seq)
		}
		seq = ev.Sequence
		if x := ev.GetXid(); x != nil && x.Xid == 79 && x.GetGpuIndex() == 3 && x.Fatal && x.Simulated {
			sawXID = true
		}
		// XID 79 on one GPU withdraws that GPU alone: GPUHealthy stays True (decision 0630).
		if h := ev.GetHealthChanged(); h != nil && !sawWithdrawn && slices.Equal(h.Current.GetUnhealthyGpuIndexes(), []int32{3}) {
			if h.Current.GpuHealthyReason != "GPUsWithdrawn" || !h.Current.GpuHealthy || h.Current.State != machinev1.HealthState_HEALTH_STATE_DEGRADED {
				t.Errorf("withdrawn event %v", h.Current)
			}
			t.Logf("XID 79 injected -> GPU 3 withdrawn (%s) in %v", h.Current.GpuHealthyReason, time.Since(t0).Round(time.Millisecond))
			sawWithdrawn = true
		}
	}
	// Clearing repairs the simulated GPU; health clears after the 1 s hold.
	t1 := time.Now()
	if _, err := c.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if h := ev.GetHealthChanged(); h != nil && h.Current.State == machinev1.HealthState_HEALTH_STATE_HEALTHY {
			if d := time.Since(t1); d < time.Second {
				t.Errorf("health cleared after %v, before the 1 s hysteresis", d)
			}
			break
		}
	}
	// A spec the simulator does not understand is INVALID_ARGUMENT.
	if _, err := c.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu9"}}); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Errorf("fault on gpu9: %v", err)
	}
	if _, err := c.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:48@gpu1", Kind: agentv1.FaultKind_FAULT_KIND_XID, GpuIndex: ptr(int32(2)), Value: 48}}); err == nil {
		t.Error("disagreeing spec and fields accepted")
	}

	// Metrics: gpurack_ prefix, dcgm-exporter label names.
	body := httpGet(t, "http://"+metrics+"/metrics")
	for _, want := range []string{`gpurack_gpu_temperature_celsius{Hostname=`, `UUID="GPU-`, `pci_bus_id="00000000:18:00.0"`,
		`modelName="NVIDIA H100 80GB HBM3"`, `gpurack_xid_errors_total{`, `xid="79"`, `gpurack_check_status{`, `gpurack_node_gpu_healthy{`,
		`gpurack_rack_members{`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	t.Run("promtool check metrics", func(t *testing.T) {
		promtool := k8sBin("promtool")
		if promtool == "" {
			testreq.Missing(t, "promtool is neither in the k8s-bins cache nor in PATH", "run make k8s-bins")
		}
		// The exposition must parse; promtool's lints must find nothing but the
		// camelCase label names we keep on purpose (dcgm-exporter's UUID, modelName,
		// Hostname, decision 0204).
		cmd := exec.Command(promtool, "check", "metrics", "--extended", "--lint=none")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics --extended --lint=none: %v\n%s", err, out)
		}
		cmd = exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		out, _ := cmd.CombinedOutput()
		other := 0
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" && !strings.HasSuffix(l, "label names should be written in 'snake_case' not 'camelCase'") {
				t.Errorf("promtool lint: %s", l)
				other++
			}
		}
		if other == 0 {
			t.Log("promtool check metrics: parses; lints only the dcgm-exporter camelCase label names")
		}
	})
	t.Run("grpcurl", func(t *testing.T) {
		grpcurl := k8sBin("grpcurl")
		if grpcurl == "" {
			testreq.Missing(t, "grpcurl is neither in the k8s-bins cache nor in PATH", "run make k8s-bins")
		}
		tlsArgs := []string{"-cacert", fx.caPEM, "-cert", fx.opCert, "-key", fx.opKey, "-servername", "node-a"}
		for _, args := range [][]string{{"list"}, {"describe", "gpurack.agent.v1.AgentService"}, {"gpurack.agent.v1.AgentService/Status"},
			{"-d", `{"service":"gpurack.agent.v1.AgentService"}`, "grpc.health.v1.Health/Check"}} {
			full := append(append(append([]string{}, tlsArgs...), args[:len(args)-1]...), listen, args[len(args)-1])
			if args[0] == "describe" || args[0] == "list" {
				full = append(append(append([]string{}, tlsArgs...), listen), args...)
			}
			out, err := exec.Command(grpcurl, full...).CombinedOutput()
			if err != nil {
				t.Errorf("grpcurl %v: %v\n%s", args, err, out)
				continue
			}
			s := string(out)
			switch {
			case args[0] == "list" && !strings.Contains(s, "gpurack.agent.v1.AgentService"),
				args[0] == "describe" && !strings.Contains(s, "rpc WatchEvents"),
				strings.HasSuffix(args[len(args)-1], "Status") && !regexp.MustCompile(`"nodeName":\s*"node-a"`).MatchString(s),
				strings.HasSuffix(args[len(args)-1], "Check") && !strings.Contains(s, "SERVING"):
				t.Errorf("grpcurl %v printed:\n%s", args, s)
			}
		}
		t.Log("grpcurl over mTLS: list, describe, Status, health: ok")
	})
	d.stop(t)
}

func ptr[T any](v T) *T { return &v }

// TestRunPlaintextNeedsFlag: without --insecure and without a certificate, nothing
// listens on TCP; with --insecure, not on an address other machines reach unless
// --insecure-unauthenticated-remote is given.
func TestRunPlaintextNeedsFlag(t *testing.T) {
	listen := freePort(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	d := startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", listen, "--metrics-listen", "",
		"--socket", sock)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.stderr.String(), "gpuagent running") {
		if time.Now().After(deadline) {
			t.Fatal("agent did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c, err := net.Dial("tcp", listen); err == nil {
		c.Close()
		t.Fatal("plaintext TCP served without --insecure")
	}
	// The local socket serves plaintext, root only.
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", fi, err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := agentv1.NewAgentServiceClient(conn).ListGPUs(ctx, &agentv1.ListGPUsRequest{}); err != nil {
		t.Fatal(err)
	}
	d.stop(t)

	// --insecure on every address (the default --listen) is refused: it would serve
	// the API with no authentication to whoever reaches the machine.
	_, stderr, code := runAgent(t, "run", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--insecure", "--listen", ":"+strings.Split(listen, ":")[1],
		"--metrics-listen", "", "--socket", "")
	if code != 2 || !strings.Contains(stderr, "--insecure-unauthenticated-remote") {
		t.Errorf("--insecure on every address: exit %d, stderr:\n%s", code, stderr)
	}
}

// TestThreeAgentsGossip runs three agent processes in one rack: they see each other,
// and a killed one is seen dead.
func TestThreeAgentsGossip(t *testing.T) {
	testreq.Short(t, "three agent processes")
	key := filepath.Join(t.TempDir(), "gossip.key")
	os.WriteFile(key, []byte(hex.EncodeToString([]byte("0123456789abcdef"))), 0o600)
	seed := freePort(t)
	var ds []*agentProc
	var socks []string
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		addr := seed
		if i > 0 {
			addr = freePort(t)
		}
		sock := filepath.Join(t.TempDir(), "agent.sock")
		socks = append(socks, sock)
		ds = append(ds, startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", "", "--metrics-listen", "",
			"--socket", sock, "--node-name", name, "--gossip-key-file", key, "--rack", "r", "--gossip-bind", addr, "--gossip-seed", seed, "--gossip-local"))
	}
	members := func(sock string) map[string]agentv1.MemberState {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := agentv1.NewAgentServiceClient(conn).Status(ctx, &agentv1.StatusRequest{})
		if err != nil {
			return nil
		}
		out := map[string]agentv1.MemberState{}
		for _, m := range st.GetRack().GetMembers() {
			out[m.NodeName] = m.State
		}
		return out
	}
	waitUntil(t, 60*time.Second, "all three see three alive members", func() bool {
		for _, s := range socks {
			m := members(s)
			if len(m) != 3 || m["node-a"] != agentv1.MemberState_MEMBER_STATE_ALIVE || m["node-b"] != agentv1.MemberState_MEMBER_STATE_ALIVE || m["node-c"] != agentv1.MemberState_MEMBER_STATE_ALIVE {
				return false
			}
		}
		return true
	})
	ds[2].cmd.Process.Kill()
	<-ds[2].done
	waitUntil(t, 60*time.Second, "node-c seen dead", func() bool {
		for _, s := range socks[:2] {
			if members(s)["node-c"] != agentv1.MemberState_MEMBER_STATE_DEAD {
				return false
			}
		}
		return true
	})
	ds[0].stop(t)
	ds[1].stop(t)
}

func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return string(b)
}

// k8sBin finds a binary cached by `make k8s-bins`, or "".
func k8sBin(name string) string {
	dir := os.Getenv("GPURACK_K8S_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gpurack", "k8s", "v1.34.2")
	}
	p := filepath.Join(dir, "bin", name)
	if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

// TestUnitVerifies checks agent/systemd/gpuagent.service with systemd-analyze verify,
// pointing ExecStart at this test binary (the unit names /usr/bin/gpuagent).
func TestUnitVerifies(t *testing.T) {
	sa := testreq.Tool(t, "systemd-analyze", "apt-get install systemd (hack/deps.sh lists it); it verifies the unit")
	data, err := os.ReadFile("../../systemd/gpuagent.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "Type=notify") || !strings.Contains(string(data), "WatchdogSec=") {
		t.Error("unit is not Type=notify with a watchdog")
	}
	exe, _ := os.Executable()
	unit := filepath.Join(t.TempDir(), "gpuagent.service")
	os.WriteFile(unit, []byte(strings.Replace(string(data), "/usr/bin/gpuagent", exe, 1)), 0o644)
	out, err := exec.Command(sa, "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestRunJoinsKubernetes: a simulated agent given a JoinBundle with a bootstrap token
// joins a real kube-apiserver (controlplane-bootstrap/testcluster): the Node appears
// with nvidia.com/gpu: 8, GPUHealthy=True after validation, False with its reason soon
// after an injected XID 79, and True again after clearing.
func TestRunJoinsKubernetes(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	listen := freePort(t)
	fx := newPKI(t, "sim-node-1", nil, func(b *bootv1.JoinBundle) {
		b.ApiServerEndpoint, b.ClusterCaPem, b.BootstrapToken = c.Server, string(c.CAPEM), token
		b.NodeLabels = map[string]string{"gpurack.example/pool": "sim"}
		b.NodeTaints = []*bootv1.Taint{{Key: "gpurack.example/dedicated", Value: "ml", Effect: "NoSchedule"}}
		b.Gossip = nil
	})
	// Node credentials kept from another cluster (a rebuilt control plane): the API
	// server refuses them, and the agent must fall back to the bootstrap token.
	keyDir := t.TempDir()
	stale := staleNodeCredentials(t, "sim-node-1")
	if err := kubejoin.KeepCredentials(keyDir, stale); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--join-bundle", fx.bundle,
		"--listen", listen, "--metrics-listen", "", "--socket", filepath.Join(fx.dir, "agent.sock"),
		"--interval", "1s", "--clear-after", "1s", "--key-dir", keyDir)
	admin := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gpuHealthy := func() (string, string, *corev1.Node) {
		n, err := admin.CoreV1().Nodes().Get(ctx, "sim-node-1", metav1.GetOptions{})
		if err != nil {
			return "", "", nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "GPUHealthy" {
				return string(c.Status), c.Reason, n
			}
		}
		return "", "", n
	}
	waitUntil(t, 90*time.Second, "Node with GPUHealthy=True", func() bool { s, _, _ := gpuHealthy(); return s == "True" })
	if kept, err := kubejoin.KeptCredentials(keyDir, c.Server, c.CAPEM, "sim-node-1"); err != nil || bytes.Equal(kept.CertData, stale.CertData) {
		t.Errorf("after the join the key directory should hold the new node credentials, not the refused ones (%v)", err)
	}
	_, _, n := gpuHealthy()
	if q := n.Status.Capacity["nvidia.com/gpu"]; q.Value() != 8 {
		t.Errorf("nvidia.com/gpu = %s", q.String())
	}
	if n.Labels["gpurack.example/pool"] != "sim" || n.Labels["gpurack.io/simulated"] != "true" || n.Labels["gpurack.io/driver-version"] != "535.261.03" {
		t.Errorf("labels %v", n.Labels)
	}
	// registerWithTaints: gpurack.io/unvalidated and the profile's (the node lifecycle
	// controller may add node.kubernetes.io/not-ready until it sees Ready).
	got := map[string]bool{}
	for _, tn := range n.Spec.Taints {
		got[tn.Key] = true
	}
	if !got["gpurack.io/unvalidated"] || !got["gpurack.example/dedicated"] {
		t.Errorf("taints %v", n.Spec.Taints)
	}
	cl := agentv1.NewAgentServiceClient(fx.client(t, listen, true))
	st, err := cl.Status(ctx, &agentv1.StatusRequest{})
	if err != nil || st.GetEnrollment().GetState() != agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED {
		t.Errorf("enrollment %v %v", st.GetEnrollment(), err)
	}
	t0 := time.Now()
	if _, err := cl.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
		t.Fatal(err)
	}
	allocatable := func() int64 { _, _, n := gpuHealthy(); q := n.Status.Allocatable["nvidia.com/gpu"]; return q.Value() }
	waitUntil(t, 30*time.Second, "allocatable nvidia.com/gpu 7", func() bool { return allocatable() == 7 })
	t.Logf("InjectFault xid:79@gpu3 -> allocatable nvidia.com/gpu 7 visible in the apiserver after %v", time.Since(t0).Round(time.Millisecond))
	waitUntil(t, 30*time.Second, "GPUHealthy=True/GPUsWithdrawn", func() bool { s, r, _ := gpuHealthy(); return s == "True" && r == "GPUsWithdrawn" })
	// A whole-node problem still turns GPUHealthy False.
	if _, err := cl.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "nvlink-down:4@gpu1"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "GPUHealthy=False", func() bool { s, r, _ := gpuHealthy(); return s == "False" && r == "NvlinkState" })
	t1 := time.Now()
	if _, err := cl.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "GPUHealthy=True again", func() bool { s, r, _ := gpuHealthy(); return s == "True" && r == "AllChecksPassed" })
	waitUntil(t, 30*time.Second, "allocatable 8 again", func() bool { return allocatable() == 8 })
	t.Logf("ClearFaults -> GPUHealthy=True after %v (1 s hysteresis)", time.Since(t1).Round(time.Millisecond))
	if _, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, "sim-node-1", metav1.GetOptions{}); err != nil {
		t.Errorf("node lease: %v", err)
	}
	d.stop(t)
}

// `gpuagent cdi generate` on the simulator writes the simulated spec over null-device
// nodes and lists its devices; without an NVIDIA driver the nvml backend cannot, and
// says why with exit 2.
func TestCDIGenerate(t *testing.T) {
	dir := t.TempDir()
	out, stderr, code := runAgent(t, "cdi", "generate", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile,
		"--output", filepath.Join(dir, "cdi"), "--sim-dev-dir", filepath.Join(dir, "dev"))
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1+17 || lines[0] != filepath.Join(dir, "cdi", "gpurack-simulated.yaml") ||
		!slices.Contains(lines, "  nvidia.com/gpu=7") || !slices.Contains(lines, "  nvidia.com/gpu=all") {
		t.Errorf("cdi generate printed:\n%s", out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "dev", "nvidia7")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("simulated device node nvidia7: %v %v", fi, err)
	}
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		return // a driver: the nvml case below is for machines without one
	}
	out, stderr, code = runAgent(t, "cdi", "generate", "--profile", h100Profile, "--output", filepath.Join(dir, "real"))
	if code != 2 || !strings.Contains(stderr, "NVML not available") {
		t.Errorf("cdi generate on nvml without a driver: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "real", "nvidia.yaml")); err == nil {
		t.Error("a spec was written without NVML")
	}
}

// staleNodeCredentials are node credentials for name from a CA no cluster here knows.
func staleNodeCredentials(t *testing.T, name string) *rest.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{TLSClientConfig: rest.TLSClientConfig{
		CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyData:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}}
}

// TestRunTrimsStartupPages: with --trim-after the agent gives back its binary's start-up
// pages once that long has passed, says so in its log with the resident file pages
// before and after, and goes on serving (Status answers, checklists keep finishing). The
// agent runs from a copy of the test binary: the test process maps its own binary, and
// the kernel does not page out what two processes map, so from the same file little
// would come back (and, under load, nothing).
func TestRunTrimsStartupPages(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "gpuagent.test")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemonFrom(t, bin, nil, "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", "", "--metrics-listen", "",
		"--socket", filepath.Join(dir, "agent.sock"), "--interval", "200ms", "--trim-after", "500ms")
	re := regexp.MustCompile(`gave back the start-up pages of the agent's binary" mappings=(\d+) resident_file_kib_before=(\d+) resident_file_kib_after=(\d+)`)
	var m []string
	for deadline := time.Now().Add(30 * time.Second); m == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trim line in the agent's log:\n%s", d.stderr.String())
		}
		m = re.FindStringSubmatch(d.stderr.String())
	}
	before, _ := strconv.Atoi(m[2])
	after, _ := strconv.Atoi(m[3])
	if m[1] == "0" || after >= before {
		t.Errorf("trim advised %s mappings, resident file pages %d KiB -> %d KiB: nothing given back", m[1], before, after)
	}
	t.Logf("resident file pages %d KiB -> %d KiB", before, after)
	// It goes on serving: Status answers over the socket after the trim, and the
	// checklist it reports keeps finishing anew (the interval is 200 ms).
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "agent.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	finished := func() time.Time {
		st, err := c.Status(t.Context(), &agentv1.StatusRequest{})
		if err != nil {
			t.Fatalf("Status over the socket after the trim: %v", err)
		}
		if st.GetHealth().GetGpuCount() != 8 {
			t.Fatalf("Status after the trim reports %d GPUs, want 8", st.GetHealth().GetGpuCount())
		}
		return st.GetLastChecklist().GetFinishedAt().AsTime()
	}
	first := finished()
	waitUntil(t, 30*time.Second, "a checklist finished after the trim", func() bool { return finished().After(first) })
	d.stop(t)
}

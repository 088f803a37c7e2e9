package server_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// gpubootBinary builds the real gpuboot once per test binary.
func gpubootBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpuboot-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gpuboot")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/gpurack/gpurack/pxe/cmd/gpuboot").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build gpuboot: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// instance is one gpuboot state directory and configuration.
type instance struct {
	t                 *testing.T
	bin, dir, cfg     string
	httpAddr, tlsAddr string
	creds, pin        string
	cmd               *exec.Cmd
	log               *bytes.Buffer
	// metrics is a client with a metrics-reader certificate (metricsClient).
	metrics *http.Client
}

func newInstance(t *testing.T, extra string) *instance {
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return newInstanceAt(t, "127.0.0.1", httpAddr, tlsAddr, "dhcp: {enabled: false}\ntftp: {enabled: false}\n"+extra)
}

// newInstanceAt runs `gpuboot init` and writes a configuration advertising advertise and
// listening on httpAddr and tlsAddr, with extra appended.
func newInstanceAt(t *testing.T, advertise, httpAddr, tlsAddr, extra string) *instance {
	bin := gpubootBinary(t)
	dir := t.TempDir()
	in := &instance{t: t, bin: bin, dir: dir}
	out := in.run("init", "--state-dir", filepath.Join(dir, "state"), "--advertise", advertise, "--rack", "r1")
	for _, line := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(line, "CA pin (gpurack.enroll.ca): "); ok {
			in.pin = p
		}
	}
	if in.pin == "" {
		t.Fatalf("init printed no CA pin:\n%s", out)
	}
	in.creds = filepath.Join(dir, "state", "operators", "admin")
	pub, _, _ := manifest.GenerateKey()
	pemPub, _ := manifest.MarshalPublicKeyPEM(pub)
	os.WriteFile(filepath.Join(dir, "images.pub"), pemPub, 0o644)
	os.MkdirAll(filepath.Join(dir, "images"), 0o755)
	in.httpAddr, in.tlsAddr = httpAddr, tlsAddr
	in.cfg = filepath.Join(dir, "gpuboot.yaml")
	cfg := fmt.Sprintf(`stateDir: state
advertise: %s
listen: {http: "%s", tls: "%s"}
images: {store: images, trustedKeys: [images.pub]}
racks: [{name: r1, defaultImage: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}]
logLevel: warn
%s`, advertise, in.httpAddr, in.tlsAddr, extra)
	if err := os.WriteFile(in.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return in
}

// run runs a gpuboot command to completion and returns its output.
func (in *instance) run(args ...string) string {
	in.t.Helper()
	out, err := exec.Command(in.bin, args...).CombinedOutput()
	if err != nil {
		in.t.Fatalf("gpuboot %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cli runs an operator command against the instance.
func (in *instance) cli(args ...string) string {
	in.t.Helper()
	return in.run(append(args, "--server", in.tlsAddr, "--credentials", in.creds)...)
}

func (in *instance) start() {
	in.t.Helper()
	in.log = new(bytes.Buffer)
	in.cmd = exec.Command(in.bin, "serve", "--config", in.cfg)
	in.cmd.Stdout, in.cmd.Stderr = in.log, in.log
	if err := in.cmd.Start(); err != nil {
		in.t.Fatal(err)
	}
	cmd := in.cmd
	in.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := netnstest.WaitPort(ctx, "tcp", in.tlsAddr); err != nil {
		in.t.Fatalf("gpuboot did not listen on %s: %v\n%s", in.tlsAddr, err, in.log)
	}
}

func (in *instance) kill9() {
	in.cmd.Process.Signal(syscall.SIGKILL)
	in.cmd.Wait()
}

func (in *instance) stop() {
	in.cmd.Process.Signal(syscall.SIGTERM)
	in.cmd.Wait()
}

func (in *instance) enrollClient() bootv1.EnrollmentServiceClient {
	in.t.Helper()
	conn, err := grpc.NewClient(in.tlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfigPinned(in.pin))))
	if err != nil {
		in.t.Fatal(err)
	}
	in.t.Cleanup(func() { conn.Close() })
	return bootv1.NewEnrollmentServiceClient(conn)
}

type testAgent struct {
	key   ed25519.PrivateKey
	facts *machinev1.MachineFacts
}

func newTestAgent(i int) *testAgent {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return &testAgent{key: key, facts: &machinev1.MachineFacts{
		Identity: &machinev1.MachineIdentity{BootMac: fmt.Sprintf("52:54:00:aa:%02x:%02x", i>>8, i&255), Serial: fmt.Sprintf("SN-%04d", i)},
		Ips:      []string{fmt.Sprintf("192.0.2.%d", i%250+1)},
		Hostname: "localhost", CpuModel: "AMD EPYC 9454 48-Core Processor", CpuCount: 96, MemoryBytes: 1536 << 30,
		KernelVersion: "6.1.0-31-amd64", DriverVersion: "570.195.03",
		Gpus: []*machinev1.GPU{{Index: 0, ProductName: "NVIDIA H100 80GB HBM3", PciBusId: "00000000:18:00.0", PcieCurrentGen: 5, PcieCurrentWidth: 16, NvlinkLinksActive: 18, NvlinkLinksTotal: 18}},
	}}
}

func (a *testAgent) register(ctx context.Context, c bootv1.EnrollmentServiceClient) (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: a.facts, PublicKey: a.key.Public().(ed25519.PublicKey)}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, time.Now()); err != nil {
		return nil, err
	}
	return c.Register(ctx, req)
}

// listMachines reads the inventory through the CLI (AdminService).
func (in *instance) listMachines() []*bootv1.Machine {
	in.t.Helper()
	out := in.cli("machines", "list", "-o", "json")
	var resp bootv1.ListMachinesResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		in.t.Fatalf("machines list -o json: %v\n%s", err, out)
	}
	return resp.Machines
}

// TestCrashDuringRegistrationBurst kills gpuboot with SIGKILL while 200 agents register
// at once, restarts it, and checks the inventory: every registration that was answered
// is there, no identity is recorded twice, and every history is a path through the
// lifecycle ending in the machine's state.
func TestCrashDuringRegistrationBurst(t *testing.T) {
	in := newInstance(t, "enrollment: {createRate: 10000, createBurst: 10000, sourceRate: 10000, sourceBurst: 10000}\n")
	in.start()
	c := in.enrollClient()
	const n = 200
	agents := make([]*testAgent, n)
	for i := range agents {
		agents[i] = newTestAgent(i)
	}
	var mu sync.Mutex
	answered := map[int]bool{}
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	killed := make(chan struct{})
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGate
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := agents[i].register(ctx, c); err == nil {
				mu.Lock()
				answered[i] = true
				k := len(answered)
				mu.Unlock()
				if k == 5 {
					close(killed)
				}
			}
		}()
	}
	close(startGate)
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatalf("fewer than %d registrations answered:\n%s", n/20, in.log)
	}
	in.kill9()
	wg.Wait()
	mu.Lock()
	before := len(answered)
	mu.Unlock()
	t.Logf("killed gpuboot with SIGKILL after %d of %d registrations were answered", before, n)
	if before == n {
		t.Log("every registration was answered before the kill landed; the check below still verifies durability")
	}

	in.start()
	ms := in.listMachines()
	byMAC := map[string]int{}
	for _, m := range ms {
		byMAC[m.GetIdentity().GetBootMac()]++
		if m.KeyFingerprint == "" || m.Facts == nil {
			t.Errorf("machine %s survived the crash without the key or facts it registered with", m.Id)
		}
	}
	for mac, k := range byMAC {
		if k != 1 {
			t.Errorf("identity %s recorded %d times", mac, k)
		}
	}
	for i := range answered {
		if byMAC[agents[i].facts.Identity.BootMac] != 1 {
			t.Errorf("agent %d was answered before the crash but its machine is missing", i)
		}
	}
	t.Logf("after restart: %d machines recorded (%d answered before the kill)", len(ms), before)

	// Every agent registers again (they poll): exactly n machines, no duplicates.
	for i, a := range agents {
		r, err := a.register(context.Background(), c)
		if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
			t.Fatalf("agent %d after restart: %v %v", i, r, err)
		}
	}
	ms = in.listMachines()
	if len(ms) != n {
		t.Fatalf("%d machines after everyone registered again, want %d", len(ms), n)
	}
	checkHistories(t, in, ms)
}

func checkHistories(t *testing.T, in *instance, ms []*bootv1.Machine) {
	t.Helper()
	out := in.cli("machines", "history")
	lines := strings.Split(strings.TrimSpace(out), "\n")[1:]
	byMachine := map[string][]inventory.Transition{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 6 {
			t.Fatalf("history line %q", l)
		}
		from, to := inventory.State(f[2]), inventory.State(f[3])
		if from == "(new)" {
			from = inventory.None
		}
		action := "" // f[4] is "-" for a move, else an action's first word
		if f[4] != "-" {
			action = f[4]
		}
		seq := uint64(len(byMachine[f[1]]) + 1)
		byMachine[f[1]] = append(byMachine[f[1]], inventory.Transition{Seq: seq, MachineID: f[1], From: from, To: to, Action: action})
	}
	for _, m := range ms {
		if err := inventory.CheckHistory(byMachine[m.Id], protoconv.StateFromProto(m.State)); err != nil {
			t.Errorf("machine %s: %v", m.Id, err)
		}
	}
}

// TestServeAcceptance runs the operator workflow against the real binary: an agent
// registers over TLS, the operator lists, shows, approves it through the CLI, the agent
// gets its bundle once, the REST API and rack view answer operators only, and the rack
// report renders in the three formats.
func TestServeAcceptance(t *testing.T) {
	in := newInstance(t, "")
	// An operator token for the REST API.
	out := in.run("certs", "operator", "bob", "--state-dir", filepath.Join(in.dir, "state"), "--token")
	var token string
	for _, line := range strings.Split(out, "\n") {
		if _, tok, ok := strings.Cut(line, "picks it up within a second): "); ok {
			token = strings.TrimSpace(tok)
		}
	}
	if token == "" {
		t.Fatalf("certs operator --token printed no token:\n%s", out)
	}
	in.start()
	c := in.enrollClient()
	a := newTestAgent(7)
	r, err := a.register(context.Background(), c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
		t.Fatalf("register: %v %v", r, err)
	}
	// /boot.ipxe for another, unknown machine records it as discovered.
	resp, err := http.Get("http://" + in.httpAddr + "/boot.ipxe?mac=52:54:00:bb:00:01&serial=SN-B1")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// /metrics (the TLS port, a metrics-reader certificate) shows the inventory by state
	// and the enrollment counters.
	metrics := in.scrapeMetrics()
	for _, want := range []string{`gpuboot_machines{simulated="false",state="registered"} 1`, `gpuboot_machines{simulated="false",state="discovered"} 1`, `gpuboot_enroll_registrations_total{answer="pending"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	list := in.cli("machines", "list")
	if !strings.Contains(list, "registered") || !strings.Contains(list, "discovered") || !strings.Contains(list, "52:54:00:aa:00:07") {
		t.Fatalf("machines list:\n%s", list)
	}
	t.Logf("gpuboot machines list:\n%s", list)
	show := in.cli("machines", "show", "52:54:00:aa:00:07")
	if !strings.Contains(show, bootv1.KeyFingerprint(a.key.Public().(ed25519.PublicKey))) || !strings.Contains(show, "SN-0007") {
		t.Fatalf("machines show lacks the key fingerprint or serial:\n%s", show)
	}
	t.Logf("gpuboot machines show:\n%s", show)
	in.cli("machines", "approve", "52:54:00:aa:00:07", "--reason", "acceptance test", "--slot", "U07")
	r, err = a.register(context.Background(), c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		t.Fatalf("register after approve: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(a.key, r.Challenge, r.Token)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	b, err := c.GetJoinBundle(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bundle.NodeName != "gpu-r1-u07" {
		t.Fatalf("node name %q", b.Bundle.NodeName)
	}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	if _, err := c.GetJoinBundle(context.Background(), req); status.Code(err).String() != "FailedPrecondition" {
		t.Fatalf("second bundle: %v", err)
	}
	hist := in.cli("machines", "history", "gpu-r1-u07")
	for _, want := range []string{"registered", "approved", "joining", "operator:admin", "acceptance test"} {
		if !strings.Contains(hist, want) {
			t.Errorf("history lacks %q:\n%s", want, hist)
		}
	}
	t.Logf("gpuboot machines history gpu-r1-u07:\n%s", hist)
	for _, f := range []string{"md", "json", "html"} {
		rep := in.cli("rack", "report", "r1", "--format", f)
		if !strings.Contains(rep, "gpu-r1-u07") {
			t.Errorf("rack report %s lacks the node:\n%s", f, rep)
		}
		if f == "json" && !json.Valid([]byte(rep)) {
			t.Errorf("rack report json is not JSON")
		}
	}
	// Reject and decommission through the CLI.
	in.cli("machines", "reject", "52:54:00:bb:00:01", "--reason", "not ours")
	in.cli("machines", "decommission", "gpu-r1-u07", "--reason", "acceptance done")

	// REST and rack view: operator token or operator certificate; nothing else.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(path, bearer string, client *http.Client) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+in.tlsAddr+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/api/v1/machines", "", insecure); code != http.StatusUnauthorized {
		t.Errorf("REST without credentials: %d", code)
	}
	if code, _ := get("/api/v1/machines", "gpo_wrong", insecure); code != http.StatusUnauthorized {
		t.Errorf("REST with a wrong token: %d", code)
	}
	code, body := get("/api/v1/machines?state=decommissioned", token, insecure)
	if code != http.StatusOK || !strings.Contains(body, "52:54:00:aa:00:07") {
		t.Errorf("REST with the operator token: %d\n%s", code, body)
	}
	code, body = get("/racks/r1", token, insecure)
	if code != http.StatusOK || !strings.Contains(body, "<table>") || strings.Contains(body, "<script") || strings.Contains(body, "<link") {
		t.Errorf("rack view: %d\n%s", code, body)
	}
	kp, err := pki.LoadKeyPair(filepath.Join(in.creds, "operator.crt"), filepath.Join(in.creds, "operator.key"))
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{kp.TLSCertificate()}}}}
	if code, _ := get("/api/v1/machines/gpu-r1-u07/history", "", withCert); code != http.StatusOK {
		t.Errorf("REST with the operator certificate: %d", code)
	}
	// An agent certificate is not an operator.
	ca, _ := pki.LoadCA(filepath.Join(in.dir, "state", "pki"))
	agentKP, _ := pki.IssueAgent(ca, "gpu-x", nil)
	withAgent := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{agentKP.TLSCertificate()}}}}
	if code, _ := get("/api/v1/machines", "", withAgent); code != http.StatusForbidden {
		t.Errorf("REST with an agent certificate: %d, want 403", code)
	}

	// AdminService over gRPC: no client certificate is UNAUTHENTICATED, an agent
	// certificate PERMISSION_DENIED.
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		want  string
	}{{"no certificate", nil, "Unauthenticated"}, {"agent certificate", []tls.Certificate{agentKP.TLSCertificate()}, "PermissionDenied"}} {
		cfg := pki.ClientConfigPinned(in.pin)
		cfg.Certificates = tc.certs
		conn, err := grpc.NewClient(in.tlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = bootv1.NewAdminServiceClient(conn).ListMachines(context.Background(), &bootv1.ListMachinesRequest{})
		conn.Close()
		if got := status.Code(err).String(); got != tc.want {
			t.Errorf("AdminService with %s: %v, want %s", tc.name, err, tc.want)
		}
	}

	// Server reflection, with the grpcurl of `make k8s-bins` when it is installed.
	t.Run("grpcurl reflection", func(t *testing.T) {
		grpcurl := testreq.Tool(t, "grpcurl", "run make k8s-bins and put its bin folder on PATH (make test does)")
		out, err := exec.Command(grpcurl, "-cacert", filepath.Join(in.creds, "ca.crt"), "-cert", filepath.Join(in.creds, "operator.crt"),
			"-key", filepath.Join(in.creds, "operator.key"), in.tlsAddr, "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "gpurack.boot.v1.EnrollmentService") || !strings.Contains(string(out), "gpurack.boot.v1.AdminService") {
			t.Errorf("grpcurl list: %v\n%s", err, out)
		}
		t.Logf("grpcurl list:\n%s", out)
	})
	in.stop()
}

func passingChecklist(a *testAgent) *machinev1.Checklist {
	return &machinev1.Checklist{Identity: a.facts.Identity, Phase: machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING,
		Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS}}}
}

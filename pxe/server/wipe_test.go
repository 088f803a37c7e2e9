package server_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// joinedAgent takes a new agent through approval (by the CLI) and its bundle, and
// returns it with a client that calls with its agent certificate.
func (in *instance) joinedAgent(i int) (*testAgent, bootv1.EnrollmentServiceClient) {
	in.t.Helper()
	ctx := context.Background()
	c := in.enrollClient()
	a := newTestAgent(i)
	if _, err := a.register(ctx, c); err != nil {
		in.t.Fatal(err)
	}
	in.cli("machines", "approve", a.facts.Identity.BootMac, "--reason", "wipe test")
	r, err := a.register(ctx, c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		in.t.Fatalf("register after approval: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(a.key, r.Challenge, r.Token)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	b, err := c.GetJoinBundle(ctx, req)
	if err != nil {
		in.t.Fatal(err)
	}
	cert, err := pki.DecodeCertPEM([]byte(b.Bundle.AgentCertificatePem))
	if err != nil {
		in.t.Fatal(err)
	}
	tcfg := pki.ClientConfigPinned(in.pin)
	tcfg.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert}}
	conn, err := grpc.NewClient(in.tlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(tcfg)))
	if err != nil {
		in.t.Fatal(err)
	}
	in.t.Cleanup(func() { conn.Close() })
	return a, bootv1.NewEnrollmentServiceClient(conn)
}

// cliFails runs an operator command that must fail and returns its output.
func (in *instance) cliFails(args ...string) string {
	in.t.Helper()
	out, err := exec.Command(in.bin, append(args, "--server", in.tlsAddr, "--credentials", in.creds)...).CombinedOutput()
	if err == nil {
		in.t.Fatalf("gpuboot %s succeeded:\n%s", strings.Join(args, " "), out)
	}
	return string(out)
}

// TestServeWipeDisk runs a data-disk wipe against the real binary: the agent's mTLS
// heartbeat reports its disks, `machines show` lists them, `machines wipe-disk` refuses
// a wrong serial and records a right one, the agent's next heartbeat answer carries
// the wipe, its result clears it, and `machines history` shows both actions.
func TestServeWipeDisk(t *testing.T) {
	in := newInstance(t, "")
	help := in.run("machines", "wipe-disk", "--help")
	for _, want := range []string{"first and last 2 MiB", "not a secure erase", "checks the serial again", "gpuboot machines history MACHINE"} {
		if !strings.Contains(help, want) {
			t.Errorf("wipe-disk --help lacks %q:\n%s", want, help)
		}
	}
	in.start()
	a, mtls := in.joinedAgent(41)
	mac := a.facts.Identity.BootMac
	heartbeat := func(result *machinev1.DataDiskWipeResult) *bootv1.HeartbeatResponse {
		t.Helper()
		resp, err := mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, WipeResult: result,
			DataDisks: &machinev1.DataDisks{Disks: []*machinev1.DataDisk{
				{Path: "/dev/sdb", Serial: "WD-123", Model: "WDC WUH721816AL", SizeBytes: 16 << 40, State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, Detail: `ext4 filesystem (label "scratch")`},
			}}})
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		return resp
	}
	heartbeat(nil)
	show := in.cli("machines", "show", mac)
	for _, want := range []string{"data disks", "/dev/sdb", "refused", "WD-123", "WDC WUH721816AL", "16.0 TiB", `ext4 filesystem (label "scratch")`} {
		if !strings.Contains(show, want) {
			t.Errorf("machines show lacks %q:\n%s", want, show)
		}
	}
	if out := in.cliFails("machines", "wipe-disk", mac, "--disk", "/dev/sdb", "--serial", "WD-999", "--reason", "reuse"); !strings.Contains(out, "does not match") {
		t.Errorf("wrong serial: %s", out)
	}
	if out := in.cliFails("machines", "wipe-disk", mac, "--disk", "/dev/sdb", "--serial", "WD-123"); !strings.Contains(out, "--reason is required") {
		t.Errorf("no reason: %s", out)
	}
	if out := in.cli("machines", "wipe-disk", mac, "--disk", "/dev/sdb", "--serial", "WD-123", "--reason", "old scratch disk"); !strings.Contains(out, "requested as wipe-") {
		t.Errorf("wipe-disk: %s", out)
	}
	show = in.cli("machines", "show", mac)
	if !strings.Contains(show, "pending wipe: /dev/sdb serial WD-123") {
		t.Errorf("machines show lacks the pending wipe:\n%s", show)
	}
	t.Logf("gpuboot machines show:\n%s", show)
	w := heartbeat(nil).GetWipe()
	if w.GetPath() != "/dev/sdb" || w.GetSerial() != "WD-123" {
		t.Fatalf("the heartbeat answer's wipe: %v", w)
	}
	if heartbeat(&machinev1.DataDiskWipeResult{Id: w.GetId(), Wiped: true}).GetWipe() != nil {
		t.Fatal("the wipe is still handed out after its result")
	}
	hist := in.cli("machines", "history", mac)
	fp := bootv1.KeyFingerprint(a.key.Public().(ed25519.PublicKey))
	for _, want := range []string{"wipe-data-disk requested", "operator:admin", "/dev/sdb serial WD-123: old scratch disk", "wipe-data-disk done", "agent:" + fp} {
		if !strings.Contains(hist, want) {
			t.Errorf("history lacks %q:\n%s", want, hist)
		}
	}
	t.Logf("gpuboot machines history:\n%s", hist)
	if rep := in.cli("rack", "report", "r1"); !strings.Contains(rep, "/dev/sdb serial WD-123, refused") {
		t.Errorf("rack report lacks the refused disk:\n%s", rep)
	}
	checkHistories(t, in, in.listMachines())
}

package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/disksel"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

func wantCode(t *testing.T, err error, code codes.Code, what string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: err = %v, want %s", what, err, code)
	}
}

func TestUnapprovedMachineNeverGetsBundle(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:01", "SN1")
	for i := 0; i < 3; i++ {
		r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
		if r.Token != "" || len(r.Challenge) != 0 {
			t.Fatalf("pending answer carries a token: %+v", r)
		}
	}
	m := e.machine("52:54:00:00:00:01")
	// Guessing tokens: a well-formed token for the right machine id.
	for _, tok := range []string{m.ID + ".guess", m.ID + ".", "", "x.y", m.ID} {
		_, err := a.bundle(tok, make([]byte, 32))
		wantCode(t, err, codes.NotFound, "bundle for an unapproved machine with token "+tok)
	}
	// Rejected: never, and Register says so.
	if _, err := e.svc.Reject(context.Background(), m.ID, "operator:test", "not ours"); err != nil {
		t.Fatal(err)
	}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_REJECTED)
	if m := e.machine("52:54:00:00:00:01"); m.Approval != nil || m.State != inventory.Rejected {
		t.Fatalf("rejected machine has %+v", m)
	}
	e.checkHistory("52:54:00:00:00:01")
}

func TestApprovedMachineGetsExactlyOneBundle(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:02", "SN2")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:02")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if len(r.Challenge) != 32 || r.Token == "" || r.Ttl.AsDuration() != DefaultTokenTTL {
		t.Fatalf("approved answer %+v", r)
	}
	// Polling again returns the same token and challenge.
	r2 := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if r2.Token != r.Token || string(r2.Challenge) != string(r.Challenge) {
		t.Fatal("second poll returned a new token")
	}

	// Ten concurrent redemptions by the right agent: exactly one bundle.
	var mu sync.Mutex
	var bundles []*bootv1.JoinBundle
	var codesSeen []codes.Code
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := a.bundle(r.Token, r.Challenge)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				bundles = append(bundles, b)
			} else {
				codesSeen = append(codesSeen, status.Code(err))
			}
		}()
	}
	wg.Wait()
	if len(bundles) != 1 {
		t.Fatalf("%d bundles released, want exactly 1 (refusals: %v)", len(bundles), codesSeen)
	}
	for _, c := range codesSeen {
		if c != codes.FailedPrecondition {
			t.Errorf("second redemption: %s, want FailedPrecondition", c)
		}
	}
	b := bundles[0]
	cert, err := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	if err != nil {
		t.Fatal(err)
	}
	if !cert.PublicKey.(ed25519.PublicKey).Equal(a.key.Public()) {
		t.Fatal("agent certificate does not certify the agent's key")
	}
	if pki.RoleOf(cert) != pki.RoleAgents || cert.Subject.CommonName != b.NodeName || b.NodeName == "" {
		t.Fatalf("agent certificate subject %v, node name %q", cert.Subject, b.NodeName)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: e.ca.CertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("agent certificate does not verify against the gpurack CA: %v", err)
	}
	if b.AgentKeyRef != a.fp() || b.Identity.GetBootMac() != "52:54:00:00:00:02" || len(b.Gossip.GetKey()) != 32 || b.Gossip.GetRack() != "r1" {
		t.Fatalf("bundle fields: ref %q identity %v gossip %v", b.AgentKeyRef, b.Identity, b.Gossip)
	}
	// After the release: Register says BUNDLE_RELEASED, never a new token.
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_BUNDLE_RELEASED)
	_, err = a.bundle(r.Token, r.Challenge)
	wantCode(t, err, codes.FailedPrecondition, "redeeming a used token")
	if m := e.machine("52:54:00:00:00:02"); m.State != inventory.Joining {
		t.Fatalf("state %s after release, want joining", m.State)
	}
	e.checkHistory("52:54:00:00:00:02")
}

func TestExpiredTokenRefused(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:03", "SN3")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:03")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	e.clk.Add(DefaultTokenTTL + time.Second)
	// Keep the key live for the purposes of this test: it polls.
	_, err := a.bundle(r.Token, r.Challenge)
	wantCode(t, err, codes.NotFound, "expired token")
	// A new poll issues a new token and challenge, which work.
	r2 := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if r2.Token == r.Token || string(r2.Challenge) == string(r.Challenge) {
		t.Fatal("expired token reissued")
	}
	_, err = a.bundle(r.Token, r.Challenge)
	wantCode(t, err, codes.NotFound, "old token after reissue")
	if _, err := a.bundle(r2.Token, r2.Challenge); err != nil {
		t.Fatalf("fresh token: %v", err)
	}
}

func TestTokenForAnotherIdentityRefused(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:04", "SN4")
	b := e.agent("52:54:00:00:00:05", "SN5")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	b.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:04")
	e.approve("52:54:00:00:00:05")
	ra := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	rb := b.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	// b presents a's token (it learnt token and challenge somehow) signed by b's key.
	_, err := b.bundle(ra.Token, ra.Challenge)
	wantCode(t, err, codes.PermissionDenied, "a's token redeemed by b's key")
	// b presents its own token with a signature over a's challenge.
	req := &bootv1.GetJoinBundleRequest{Token: rb.Token, Signature: bootv1.SignJoinBundle(b.key, ra.Challenge, rb.Token)}
	bootv1.SignRequest(b.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, e.clk.Now())
	_, err = b.c.GetJoinBundle(context.Background(), req)
	wantCode(t, err, codes.PermissionDenied, "signature over another machine's challenge")
	// Request auth by a, join signature by b: refused too.
	req = &bootv1.GetJoinBundleRequest{Token: ra.Token, Signature: bootv1.SignJoinBundle(b.key, ra.Challenge, ra.Token)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, e.clk.Now())
	_, err = a.c.GetJoinBundle(context.Background(), req)
	wantCode(t, err, codes.PermissionDenied, "join signature by another key")
	// The rightful holders still get theirs, once.
	if _, err := a.bundle(ra.Token, ra.Challenge); err != nil {
		t.Fatal(err)
	}
	if _, err := b.bundle(rb.Token, rb.Challenge); err != nil {
		t.Fatal(err)
	}
}

// Every client in this test connects from 127.0.0.1, the approved machine's address:
// the address buys nothing.
func TestSameSourceAddressGetsNothingMore(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:06", "SN6")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:06")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)

	// An impostor claims the same identity with its own key from the same address.
	imp := a.rebooted()
	ri := imp.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if ri.Token != "" {
		t.Fatal("impostor got a token")
	}
	_, err := imp.bundle(r.Token, r.Challenge)
	wantCode(t, err, codes.PermissionDenied, "impostor redeeming the approved token")
	// Unsigned and badly signed calls.
	_, err = imp.c.GetJoinBundle(context.Background(), &bootv1.GetJoinBundleRequest{Token: r.Token})
	wantCode(t, err, codes.Unauthenticated, "unsigned GetJoinBundle")
	_, err = imp.c.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity})
	wantCode(t, err, codes.Unauthenticated, "unsigned heartbeat")
	// Both keys keep calling after the newer registered: the live bound key keeps
	// the identity (decision 0405); the impostor's key is recorded and gets nothing.
	e.clk.Add(time.Second)
	if _, err := a.heartbeat(a.c, true); err != nil {
		t.Fatal(err)
	}
	imp.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if m := e.machine("52:54:00:00:00:06"); m.State != inventory.Approved || len(m.Keys) != 2 || m.BoundKey != a.fp() {
		t.Fatalf("state %s with %d keys bound to %s, want approved with 2 bound to %s", m.State, len(m.Keys), m.BoundKey, a.fp())
	}
	r = a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if _, err := a.bundle(r.Token, r.Challenge); err != nil {
		t.Fatal(err)
	}
	e.checkHistory("52:54:00:00:00:06")
}

func TestRequestAuthStaleOrTampered(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:07", "SN7")
	req := &bootv1.RegisterRequest{Facts: a.facts, PublicKey: a.key.Public().(ed25519.PublicKey)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, e.clk.Now().Add(-3*time.Minute))
	_, err := a.c.Register(context.Background(), req)
	wantCode(t, err, codes.Unauthenticated, "request signed 3 minutes ago")
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, e.clk.Now())
	req.Facts.Hostname = "tampered"
	_, err = a.c.Register(context.Background(), req)
	wantCode(t, err, codes.Unauthenticated, "tampered request")
	// Signed by one key, registering another.
	_, other, _ := ed25519.GenerateKey(nil)
	req = &bootv1.RegisterRequest{Facts: a.facts, PublicKey: other.Public().(ed25519.PublicKey)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, e.clk.Now())
	_, err = a.c.Register(context.Background(), req)
	wantCode(t, err, codes.InvalidArgument, "public_key differs from the signing key")
	if n, _ := e.store.List(context.Background()); len(n) != 0 {
		t.Fatalf("refused requests created %d records", len(n))
	}
}

// TestRequestAuthBoundToMethod: a request whose auth was signed for another method is
// refused, although everything else in it is right; signed for its own method, the same
// request then succeeds, so the method alone made the difference.
func TestRequestAuthBoundToMethod(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:0b", "SN11")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:0b")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)

	get := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(a.key, r.Challenge, r.Token)}
	for _, other := range []string{bootv1.EnrollmentService_Register_FullMethodName, bootv1.EnrollmentService_Heartbeat_FullMethodName} {
		if err := bootv1.SignRequest(a.key, other, get, e.clk.Now()); err != nil {
			t.Fatal(err)
		}
		_, err := a.c.GetJoinBundle(context.Background(), get)
		wantCode(t, err, codes.Unauthenticated, "GetJoinBundle signed for "+other)
	}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, get, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if b, err := a.c.GetJoinBundle(context.Background(), get); err != nil || b.GetBundle().GetNodeName() == "" {
		t.Fatalf("GetJoinBundle signed for its own method: %v, %v", b, err)
	}

	hb := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true}}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, hb, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	_, err := a.c.Heartbeat(context.Background(), hb)
	wantCode(t, err, codes.Unauthenticated, "Heartbeat signed for ReportCommissioning")
	if _, err := a.heartbeat(a.c, true); err != nil {
		t.Fatalf("Heartbeat signed for its own method: %v", err)
	}
}

func TestLifecycleThroughCommissioning(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:08", "SN8")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	// Pre-approval report: stored, no state change.
	rr, err := a.report(a.c, true, machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL, machinev1.CheckStatus_CHECK_STATUS_FAIL)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_REGISTERED {
		t.Fatalf("pre-approval report: %v, %v", rr, err)
	}
	if m := e.machine("52:54:00:00:00:08"); len(m.Checklist) == 0 {
		t.Fatal("pre-approval checklist not stored")
	}
	// A COMMISSIONING report before approval changes nothing either.
	rr, _ = a.report(a.c, true, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_PASS)
	if rr.MachineState != bootv1.MachineState_MACHINE_STATE_REGISTERED {
		t.Fatalf("commissioning report before approval moved to %s", rr.MachineState)
	}
	e.approve("52:54:00:00:00:08")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		t.Fatal(err)
	}
	// From here the agent uses mTLS with its certificate and its own key.
	cert, _ := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	mtls := e.client(tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert})
	hb, err := a.heartbeat(mtls, false)
	if err != nil || hb.MachineState != bootv1.MachineState_MACHINE_STATE_JOINING {
		t.Fatalf("mTLS heartbeat: %v, %v", hb, err)
	}
	if _, err := e.svc.NodeRegistered(context.Background(), b.NodeName, e.nodeBootID(t, b.NodeName)); err != nil {
		t.Fatal(err)
	}
	rr, err = a.report(mtls, false, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_FAIL)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_QUARANTINED {
		t.Fatalf("failing commissioning report: %v, %v", rr, err)
	}
	rr, err = a.report(mtls, false, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_PASS)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
		t.Fatalf("passing commissioning report: %v, %v", rr, err)
	}
	// Another machine's certificate cannot speak for this identity.
	o := e.agent("52:54:00:00:00:09", "SN9")
	o.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:09")
	ro := o.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	ob, _ := o.bundle(ro.Token, ro.Challenge)
	ocert, _ := pki.DecodeCertPEM([]byte(ob.AgentCertificatePem))
	omtls := e.client(tls.Certificate{Certificate: [][]byte{ocert.Raw}, PrivateKey: o.key, Leaf: ocert})
	_, err = a.heartbeat(omtls, false)
	wantCode(t, err, codes.PermissionDenied, "heartbeat for a's identity with o's certificate")

	// Decommission revokes the certificate: its calls fail.
	if _, err := e.svc.Decommission(context.Background(), b.NodeName, "operator:test", "retired"); err != nil {
		t.Fatal(err)
	}
	if !e.svc.Revoked(cert.SerialNumber) {
		t.Fatal("certificate not revoked")
	}
	_, err = a.heartbeat(mtls, false)
	if err == nil {
		t.Fatal("decommissioned machine's heartbeat accepted")
	}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_DECOMMISSIONED)
	// It boots again: discovered, no keys, starts over.
	id, _ := identity.New("52:54:00:00:00:08", a.facts.Identity.SmbiosUuid, "SN8")
	d, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.8"))
	if err != nil || d.Action != BootImage {
		t.Fatalf("boot after decommission: %+v, %v", d, err)
	}
	if m := e.machine("52:54:00:00:00:08"); m.State != inventory.Discovered {
		t.Fatalf("state %s after booting again, want discovered", m.State)
	}
	e.checkHistory("52:54:00:00:00:08")
}

func TestReenrollAfterReboot(t *testing.T) {
	for _, mode := range []Reenroll{ReenrollAuto, ReenrollManual} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Reenroll = mode })
			a := e.agent("52:54:00:00:00:0a", "SN10")
			a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
			e.approve("52:54:00:00:00:0a")
			r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
			if _, err := a.bundle(r.Token, r.Challenge); err != nil {
				t.Fatal(err)
			}
			// The machine reboots: /boot.ipxe is recorded and ends nothing
			// (decision 0405); the new key waits while the old key is live.
			id, _ := identity.New("52:54:00:00:00:0a", a.facts.Identity.SmbiosUuid, "SN10")
			if _, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.10")); err != nil {
				t.Fatal(err)
			}
			n := a.rebooted()
			oldSerials := e.machine("52:54:00:00:00:0a").AgentCertSerials
			if len(oldSerials) != 1 {
				t.Fatalf("%d agent certificates recorded, want 1", len(oldSerials))
			}
			n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
			// The old agent is gone: once its key stopped calling, the new key takes over.
			e.clk.Add(inventory.KeyLiveness + time.Second)
			if mode == ReenrollAuto {
				r := n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
				if _, err := n.bundle(r.Token, r.Challenge); err != nil {
					t.Fatal(err)
				}
				// The old key gets nothing more, and its certificate is revoked.
				a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
				sn, _ := new(big.Int).SetString(oldSerials[0], 16)
				if !e.svc.Revoked(sn) {
					t.Fatal("the old key's agent certificate was not revoked on re-enrollment")
				}
			} else {
				n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
				if m := e.machine("52:54:00:00:00:0a"); m.State != inventory.Registered {
					t.Fatalf("manual reenroll: state %s", m.State)
				}
			}
			e.checkHistory("52:54:00:00:00:0a")
		})
	}
}

func TestReenrollAfterHeartbeatTimeout(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:0b", "SN11")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:0b")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	a.bundle(r.Token, r.Challenge)
	// New key while the old one is live: waits.
	n := a.rebooted()
	n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	// Old key silent for 3 minutes: the new one takes over.
	e.clk.Add(inventory.KeyLiveness + time.Second)
	n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	e.checkHistory("52:54:00:00:00:0b")
}

func TestAllowlistAndHoldMode(t *testing.T) {
	list, err := policy.ParseListBytes("r1.csv", []byte("serial,mac,rack,slot\nSN12,,r1,U12\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
		c.UnknownMachines = Hold
		c.Selectors = []policy.Selector{{Name: "h100", Match: map[string]string{"sku": "NVIDIA-H100-80GB-HBM3"},
			Image: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", NodeLabels: map[string]string{"gpurack.io/pool": "train"},
			NodeTaints: []string{"nvidia.com/gpu=present:NoSchedule"}, DataDisks: []disksel.RuleSpec{{Transport: "nvme", MinSize: "1.92T"}}}}
		c.PodNetwork = &bootv1.PodNetwork{Backend: "host-gw"}
		c.LogsEndpoint = "10.0.0.2:9428"
		c.Registry = "10.0.0.2:5000"
	})
	// Listed machine: approved at discovery, boots its image although hold mode.
	id, _ := identity.New("52:54:00:00:00:0c", "", "SN12")
	d, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.12"))
	if err != nil || d.Action != BootImage {
		t.Fatalf("listed machine: %+v, %v", d, err)
	}
	a := e.agent("52:54:00:00:00:0c", "SN12")
	a.facts.Identity.SmbiosUuid = ""
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		t.Fatal(err)
	}
	if b.NodeName != "gpu-r1-u12" {
		t.Fatalf("node name %q, want gpu-r1-u12", b.NodeName)
	}
	// The selector matched on the sku from the facts: its image, node labels and taints.
	if b.ImageId != strings.Repeat("b", 40) || b.NodeLabels["gpurack.io/pool"] != "train" || len(b.NodeTaints) != 1 || b.NodeTaints[0].Effect != "NoSchedule" {
		t.Fatalf("bundle image %q labels %v taints %v", b.ImageId, b.NodeLabels, b.NodeTaints)
	}
	// The selector's data-disk rules go along, to replace the profile's.
	if r := b.GetDataDisks().GetRules(); len(r) != 1 || r[0].GetTransport() != "nvme" || r[0].GetMinSize() != "1.92T" {
		t.Errorf("bundle data-disk rules %v, want the selector's", b.GetDataDisks())
	}
	// cluster.podNetwork goes along as set: the backend, and no subnet.
	if pn := b.GetPodNetwork(); pn.GetBackend() != "host-gw" || pn.GetSubnet() != "" {
		t.Errorf("bundle pod network %v, want backend host-gw and no subnet", pn)
	}
	// cluster.logsEndpoint goes along as set.
	if got := b.GetLogsEndpoint(); got != "10.0.0.2:9428" {
		t.Errorf("bundle logs endpoint %q, want 10.0.0.2:9428 (cluster.logsEndpoint)", got)
	}
	// cluster.registry goes along as set.
	if got := b.GetRegistry(); got != "10.0.0.2:5000" {
		t.Errorf("bundle registry %q, want 10.0.0.2:5000 (cluster.registry)", got)
	}
	// Unlisted machine: held, then pending.
	id2, _ := identity.New("52:54:00:00:00:0d", "", "SN13")
	d, _ = e.svc.DecideBoot(context.Background(), id2, netip.MustParseAddr("192.0.2.13"))
	if d.Action != BootHold {
		t.Fatalf("unlisted machine in hold mode: %+v", d)
	}
	u := e.agent("52:54:00:00:00:0d", "SN13")
	u.facts.Identity.SmbiosUuid = ""
	u.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.checkHistory("52:54:00:00:00:0c")
	e.checkHistory("52:54:00:00:00:0d")
}

func TestDiscoveredRecordsAreCapped(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxUnapproved = 5 })
	held := 0
	for i := 0; i < 20; i++ {
		id, _ := identity.New(macN(i), "", "")
		d, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.1"))
		if err != nil {
			t.Fatal(err)
		}
		if d.MachineID == "" {
			held++
		}
	}
	all, _ := e.store.List(context.Background())
	if len(all) != 5 || held != 15 {
		t.Fatalf("%d records, %d held; want 5 and 15", len(all), held)
	}
	// Register from random identities is capped the same way.
	a := e.agent(macN(100), "X")
	_, err := a.register()
	wantCode(t, err, codes.ResourceExhausted, "register beyond the cap")
	// Rejecting one frees a place.
	if _, err := e.svc.Reject(context.Background(), all[0].ID, "operator:test", "junk"); err != nil {
		t.Fatal(err)
	}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)

	// Creation rate: burst 3, effectively no refill.
	e2 := newEnv(t, func(c *Config) { c.CreateRate = 1e-9; c.CreateBurst = 3 })
	for i := 0; i < 10; i++ {
		id, _ := identity.New(macN(i), "", "")
		e2.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.1"))
	}
	if all, _ := e2.store.List(context.Background()); len(all) != 3 {
		t.Fatalf("rate limit: %d records, want 3", len(all))
	}
}

func macN(i int) string {
	return netipMAC(byte(i>>8), byte(i))
}

func netipMAC(a, b byte) string {
	const hexd = "0123456789abcdef"
	return "52:54:00:01:" + string([]byte{hexd[a>>4], hexd[a&15]}) + ":" + string([]byte{hexd[b>>4], hexd[b&15]})
}

func TestConflictNewerKeyWins(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:0e", "SN14")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	// No key is bound yet: two live keys are a conflict for an operator.
	n := a.rebooted()
	n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.clk.Add(time.Second)
	a.heartbeat(a.c, true)
	n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT)
	// Unknown key: refused, state unchanged.
	if _, err := e.svc.ResolveConflict(context.Background(), "52:54:00:00:00:0e", "sha256:00", "operator:test", "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown winner: %v", err)
	}
	if _, err := e.svc.ResolveConflict(context.Background(), "52:54:00:00:00:0e", n.fp(), "operator:test", "motherboard replaced"); err != nil {
		t.Fatal(err)
	}
	// The old key is gone; the new one is approved and gets a bundle.
	e.approve("52:54:00:00:00:0e")
	rn := n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if _, err := n.bundle(rn.Token, rn.Challenge); err != nil {
		t.Fatal(err)
	}
	_, err := a.heartbeat(a.c, true)
	wantCode(t, err, codes.PermissionDenied, "heartbeat by the losing key")
	e.checkHistory("52:54:00:00:00:0e")
	// Not in conflict any more: FAILED_PRECONDITION-class error.
	if _, err := e.svc.ResolveConflict(context.Background(), "52:54:00:00:00:0e", n.fp(), "operator:test", "again"); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("resolving a machine not in conflict: %v", err)
	}
}

func TestOperatorActionsRespectTheLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:0f", "SN15")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:0f")
	ctx := context.Background()
	if _, err := e.svc.Approve(ctx, "52:54:00:00:00:0f", ApproveOptions{Actor: "operator:test"}); !errors.Is(err, ErrPrecondition) {
		t.Errorf("approving an approved machine: %v", err)
	}
	if _, err := e.svc.Reject(ctx, "52:54:00:00:00:0f", "operator:test", "changed my mind"); !errors.Is(err, ErrPrecondition) {
		t.Errorf("rejecting an approved machine: %v", err)
	}
	if _, err := e.svc.Reject(ctx, "52:54:00:00:00:0f", "operator:test", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("reject without reason: %v", err)
	}
	if _, err := e.svc.Resolve(ctx, "52:54:00:99:99:99"); !errors.Is(err, inventory.ErrNotFound) {
		t.Errorf("unknown ref: %v", err)
	}
	if _, err := e.svc.Approve(ctx, "52:54:00:00:00:0f", ApproveOptions{Actor: "operator:test", NodeName: "Bad_Name"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid node name: %v", err)
	}
	if _, err := e.svc.Decommission(ctx, "52:54:00:00:00:0f", "operator:test", "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Decommission(ctx, "52:54:00:00:00:0f", "operator:test", "gone again"); !errors.Is(err, ErrPrecondition) {
		t.Errorf("decommissioning twice: %v", err)
	}
	e.checkHistory("52:54:00:00:00:0f")
}

func TestLateHeartbeatIgnored(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:10", "SN16")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	started := timestamppb.New(e.clk.Now().Add(-time.Minute))
	send := func(seq uint64, state machinev1.HealthState) {
		req := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, Sequence: seq, AgentStartedAt: started,
			Health: &machinev1.HealthSummary{State: state}}
		bootv1.SignRequest(a.key, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, e.clk.Now())
		if _, err := a.c.Heartbeat(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	health := func() machinev1.HealthState {
		var h machinev1.HealthSummary
		proto.Unmarshal(e.machine("52:54:00:00:00:10").Health, &h)
		return h.State
	}
	send(2, machinev1.HealthState_HEALTH_STATE_UNHEALTHY)
	send(1, machinev1.HealthState_HEALTH_STATE_HEALTHY) // late duplicate of an older one
	if got := health(); got != machinev1.HealthState_HEALTH_STATE_UNHEALTHY {
		t.Fatalf("a late heartbeat overwrote the newer health: %s", got)
	}
	send(3, machinev1.HealthState_HEALTH_STATE_HEALTHY)
	if got := health(); got != machinev1.HealthState_HEALTH_STATE_HEALTHY {
		t.Fatalf("health %s after a newer heartbeat", got)
	}
	// A restarted agent process counts from 1 again.
	started = timestamppb.New(e.clk.Now())
	send(1, machinev1.HealthState_HEALTH_STATE_DEGRADED)
	if got := health(); got != machinev1.HealthState_HEALTH_STATE_DEGRADED {
		t.Fatalf("health %s after the agent restarted", got)
	}
}

// TestRejoinAfterRebootWaitsForThisBootsNode: a ready machine reboots and re-enrolls;
// its Node is still there, registered by the kubelet of the boot before. Seeing it must
// not move the rejoining machine on, nor delete the new bootstrap token its new kubelet
// has yet to use (it would stay Unauthorized for good); the Node reporting this boot's
// boot id does.
func TestRejoinAfterRebootWaitsForThisBootsNode(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Reenroll = ReenrollAuto })
	const mac = "52:54:00:00:00:1a"
	a, _, _ := ready(e, mac)
	node := e.machine(mac).NodeName
	oldBoot := a.facts.GetBootId()
	n := a.rebooted()
	if n.facts.GetBootId() == oldBoot {
		t.Fatal("the rebooted agent reports the old boot id")
	}
	n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.clk.Add(inventory.KeyLiveness + time.Second)
	r := n.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if _, err := n.bundle(r.Token, r.Challenge); err != nil {
		t.Fatal(err)
	}
	// (This harness has no cluster, so no token is minted: the state says it all; the
	// tokens are deleted in the same step as the move, and TestRack's power cycle
	// shows a real kubelet rejoining.)
	if m := e.machine(mac); m.State != inventory.Joining {
		t.Fatalf("after the rejoin's bundle: state %s, want joining", m.State)
	}
	// The Node as the old kubelet left it.
	if _, err := e.svc.NodeRegistered(context.Background(), node, oldBoot); err != nil {
		t.Fatal(err)
	}
	if m := e.machine(mac); m.State != inventory.Joining {
		t.Fatalf("the previous boot's Node moved the rejoining machine to %s", m.State)
	}
	// This boot's kubelet has registered.
	if _, err := e.svc.NodeRegistered(context.Background(), node, n.facts.GetBootId()); err != nil {
		t.Fatal(err)
	}
	if m := e.machine(mac); m.State != inventory.Commissioning {
		t.Fatalf("this boot's Node: state %s, want commissioning", m.State)
	}
	e.checkHistory(mac)
}

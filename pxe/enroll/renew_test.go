package enroll

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// bundled takes a new machine through approval and its bundle and returns the agent
// and the certificate the bundle carried.
func bundled(e *env, mac string) (*agent, *x509.Certificate) {
	e.t.Helper()
	a := e.agent(mac, "SN-"+mac)
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(mac)
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		e.t.Fatal(err)
	}
	cert, err := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	if err != nil {
		e.t.Fatal(err)
	}
	return a, cert
}

// renew asks for a certificate with c, signed by a's key when signed.
func (a *agent) renew(c bootv1.EnrollmentServiceClient, signed bool) (*x509.Certificate, error) {
	req := &bootv1.RenewAgentCertificateRequest{Identity: a.facts.Identity}
	if signed {
		if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_RenewAgentCertificate_FullMethodName, req, a.e.clk.Now()); err != nil {
			a.e.t.Fatal(err)
		}
	}
	resp, err := c.RenewAgentCertificate(context.Background(), req)
	if err != nil {
		return nil, err
	}
	return pki.DecodeCertPEM([]byte(resp.GetAgentCertificatePem()))
}

// TestRenewalRefused: only the machine's own agent renews: a decommissioned machine is
// refused whether it signs with its key or calls with its certificate, so is a key
// that was registered for the identity but is not the bound one, a bound key that
// never received a bundle, and a second renewal right after the first. A refusal
// records no serial.
func TestRenewalRefused(t *testing.T) {
	e := newEnv(t, nil)
	a, cert := bundled(e, "52:54:00:00:00:c2")
	mtls := e.client(tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert})
	if _, err := a.renew(mtls, false); err != nil {
		t.Fatalf("first renewal over mutual TLS: %v", err)
	}
	if _, err := a.renew(mtls, true); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("renewal right after a renewal: %v, want ResourceExhausted", err)
	}
	stranger := a.rebooted()
	stranger.register()
	if _, err := stranger.renew(stranger.c, true); status.Code(err) != codes.PermissionDenied {
		t.Errorf("renewal by a key that is not the bound one: %v, want PermissionDenied", err)
	}
	serials := e.machine("52:54:00:00:00:c2").AgentCertSerials
	if len(serials) != 2 {
		t.Fatalf("serials %v after the bundle and one renewal", serials)
	}
	if _, err := e.svc.Decommission(context.Background(), "52:54:00:00:00:c2", "operator:test", "retired"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		c      bootv1.EnrollmentServiceClient
		signed bool
	}{{"signed with the key", a.c, true}, {"over mutual TLS", mtls, false}} {
		_, err := a.renew(tc.c, tc.signed)
		if code := status.Code(err); code != codes.PermissionDenied && code != codes.Unauthenticated {
			t.Errorf("decommissioned machine, %s: %v, want PermissionDenied or Unauthenticated", tc.name, err)
		}
	}
	if m := e.machine("52:54:00:00:00:c2"); len(m.AgentCertSerials) != 0 {
		t.Errorf("decommissioned machine holds serials %v", m.AgentCertSerials)
	}

	b := e.agent("52:54:00:00:00:c3", "SN-c3")
	b.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:c3")
	if _, err := b.renew(b.c, true); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no JoinBundle") {
		t.Errorf("renewal before the bundle: %v, want PermissionDenied naming the missing bundle", err)
	}
}

// TestCheckRenew is the renewal decision, state by state.
func TestCheckRenew(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	const fp = "sha256:aa"
	machine := func(st inventory.State) *inventory.Machine {
		return &inventory.Machine{State: st, NodeName: "gpu-r1-u01", BoundKey: fp, Keys: []inventory.Key{{Fingerprint: fp, BundleReleased: true}}}
	}
	for _, tc := range []struct {
		name string
		m    *inventory.Machine
		fp   string
		last time.Time
		want codes.Code
	}{
		{"ready", machine(inventory.Ready), fp, time.Time{}, codes.OK},
		{"joining", machine(inventory.Joining), fp, time.Time{}, codes.OK},
		{"quarantined", machine(inventory.Quarantined), fp, time.Time{}, codes.OK},
		{"renewed long ago", machine(inventory.Ready), fp, now.Add(-time.Hour), codes.OK},
		{"renewed a moment ago", machine(inventory.Ready), fp, now.Add(-time.Minute), codes.ResourceExhausted},
		{"decommissioned", machine(inventory.Decommissioned), fp, time.Time{}, codes.PermissionDenied},
		{"rejected", machine(inventory.Rejected), fp, time.Time{}, codes.PermissionDenied},
		{"another key", machine(inventory.Ready), "sha256:bb", time.Time{}, codes.PermissionDenied},
		{"conflict", machine(inventory.Conflict), fp, time.Time{}, codes.FailedPrecondition},
		{"no bundle", func() *inventory.Machine {
			m := machine(inventory.Approved)
			m.Keys[0].BundleReleased = false
			return m
		}(), fp, time.Time{}, codes.PermissionDenied},
		{"no bound key", func() *inventory.Machine { m := machine(inventory.Ready); m.BoundKey = ""; return m }(), fp, time.Time{}, codes.PermissionDenied},
	} {
		if got := status.Code(checkRenew(tc.m, tc.fp, tc.last, now, 10*time.Hour)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// FuzzRenewAgentCertificate feeds arbitrary RenewAgentCertificateRequest encodings,
// raw and re-signed by a valid key. No certificate may come out: no key holds a bundle.
func FuzzRenewAgentCertificate(f *testing.F) {
	svc, key := fuzzService(f)
	f.Add([]byte{})
	f.Add([]byte("\x0a\x0b\x0a\x09aa:bb:cc:dd"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(bootv1.RenewAgentCertificateRequest)
		if proto.Unmarshal(data, req) != nil {
			return
		}
		ctx := context.Background()
		if _, err := svc.RenewAgentCertificate(ctx, proto.Clone(req).(*bootv1.RenewAgentCertificateRequest)); err == nil {
			t.Fatal("certificate issued for a fuzzed request")
		}
		if bootv1.SignRequest(key, bootv1.EnrollmentService_RenewAgentCertificate_FullMethodName, req, time.Now()) != nil {
			return
		}
		if _, err := svc.RenewAgentCertificate(ctx, req); err == nil {
			t.Fatal("certificate issued for a fuzzed request")
		}
	})
}

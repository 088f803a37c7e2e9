package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"net"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// TestBundleCertificateContent pins the agent certificate a JoinBundle carries
// (CONTRACTS §4): the agent's own key, role gpurack:agents in O, CN and DNS SAN the
// node name, no IP the machine claimed (only the call's source address, here loopback,
// which is left out), clientAuth + serverAuth, a year and the backdate.
func TestBundleCertificateContent(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:51", "SN51")
	// The machine claims addresses, one of them gpuboot's own: none may reach the
	// certificate.
	a.facts.Ips = []string{"192.0.2.10", "127.0.0.1", "fe80::1", "192.0.2.10", "2001:db8::10", "192.0.2.1"}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:51")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		t.Fatal(err)
	}
	if b.PodNetwork != nil {
		t.Errorf("bundle pod network %v with no cluster.podNetwork set; want none (the profile's then)", b.PodNetwork)
	}
	c, err := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject.CommonName != b.NodeName || !slices.Equal(c.Subject.Organization, []string{string(pki.RoleAgents)}) {
		t.Errorf("subject %s; want CN=%s O=%s", c.Subject, b.NodeName, pki.RoleAgents)
	}
	if !slices.Equal(c.DNSNames, []string{b.NodeName}) {
		t.Errorf("DNS SANs %v; want [%s]", c.DNSNames, b.NodeName)
	}
	if len(c.IPAddresses) != 0 {
		t.Errorf("IP SANs %v; want none: the facts' addresses are the machine's claim, and the call came over loopback", c.IPAddresses)
	}
	if c.KeyUsage != x509.KeyUsageDigitalSignature || c.IsCA ||
		!slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}) {
		t.Errorf("usages %v %v, CA %v; want digitalSignature, clientAuth+serverAuth, not a CA", c.KeyUsage, c.ExtKeyUsage, c.IsCA)
	}
	if k, ok := c.PublicKey.(ed25519.PublicKey); !ok || !k.Equal(a.key.Public()) {
		t.Error("the certificate is not for the agent's own key")
	}
	if got, want := c.NotAfter.Sub(c.NotBefore), pki.Backdate+pki.DefaultLeafValidity; got != want {
		t.Errorf("validity %v; want %v", got, want)
	}
	if err := c.CheckSignatureFrom(e.ca.Cert); err != nil {
		t.Errorf("not signed by the gpurack CA: %v", err)
	}
}

// TestObservedIPs: the certificate's addresses are the call's source address as gpuboot
// saw it, without loopback, link-local or unspecified ones.
func TestObservedIPs(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want []net.IP
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.0.3.7"), Port: 41000}, []net.IP{net.ParseIP("10.0.3.7").To4()}},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.3.7"), Port: 41000}, []net.IP{net.ParseIP("10.0.3.7").To4()}},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 41000}, []net.IP{net.ParseIP("2001:db8::7")}},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 41000}, nil},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 41000}, nil},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, nil},
	} {
		got := observedIPs(peer.NewContext(context.Background(), &peer.Peer{Addr: tc.addr}))
		if !slices.EqualFunc(got, tc.want, net.IP.Equal) {
			t.Errorf("observedIPs(%v) = %v; want %v", tc.addr, got, tc.want)
		}
	}
	if got := observedIPs(context.Background()); got != nil {
		t.Errorf("observedIPs without a peer = %v; want none", got)
	}
}

// TestReapproveLostBundle: a bundle released to a key whose answer never arrived (the
// gpuboot that released it died) leaves the agent with BUNDLE_RELEASED. An operator's
// approval of the joining machine lets the same key fetch a new bundle with a new
// token; the first token stays spent.
func TestReapproveLostBundle(t *testing.T) {
	e := newEnv(t, nil)
	mac := "52:54:00:00:00:53"
	a := e.agent(mac, "SN53")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(mac)
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if _, err := a.bundle(r.Token, r.Challenge); err != nil { // the answer is "lost"
		t.Fatal(err)
	}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_BUNDLE_RELEASED)
	if m := e.approve(mac); m.State != inventory.Approved || m.BoundKey != a.fp() {
		t.Fatalf("re-approved: %s bound %q, want approved bound to the agent's key", m.State, m.BoundKey)
	}
	r2 := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if r2.Token == r.Token {
		t.Fatal("re-approval gave the spent token again")
	}
	if _, err := a.bundle(r.Token, r.Challenge); status.Code(err) != codes.NotFound {
		t.Fatalf("the first token after re-approval: %v, want NotFound", err)
	}
	if _, err := a.bundle(r2.Token, r2.Challenge); err != nil {
		t.Fatal(err)
	}
	if m := e.machine(mac); m.State != inventory.Joining || len(m.AgentCertSerials) != 2 {
		t.Fatalf("after the second bundle: %s with %d certificates, want joining with 2", m.State, len(m.AgentCertSerials))
	}
	e.checkHistory(mac)
}

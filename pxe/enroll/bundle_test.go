package enroll

import (
	"crypto/ed25519"
	"crypto/x509"
	"net"
	"slices"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestBundleCertificateContent pins the agent certificate a JoinBundle carries
// (CONTRACTS §4): the agent's own key, role gpurack:agents in O, CN and DNS SAN the
// node name, the facts' IPs, clientAuth + serverAuth, a year and the backdate.
func TestBundleCertificateContent(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:51", "SN51")
	a.facts.Ips = []string{"192.0.2.10", "127.0.0.1", "fe80::1", "192.0.2.10", "2001:db8::10"}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:51")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		t.Fatal(err)
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
	// Loopback and link-local addresses are left out, a repeated one once.
	wantIPs := []net.IP{net.ParseIP("192.0.2.10"), net.ParseIP("2001:db8::10")}
	if !slices.EqualFunc(c.IPAddresses, wantIPs, net.IP.Equal) {
		t.Errorf("IP SANs %v; want %v", c.IPAddresses, wantIPs)
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

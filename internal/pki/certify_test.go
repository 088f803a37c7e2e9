package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"net"
	"reflect"
	"strings"
	"testing"
)

// TestCertifyAgentMatchesIssueAgent: a certificate for the agent's own key has the
// content of the one IssueAgent makes with a fresh key: subject, role, SANs, usages,
// validity; only the key and serial differ.
func TestCertifyAgentMatchesIssueAgent(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	ips := []net.IP{net.ParseIP("10.0.0.21").To4(), net.ParseIP("fd00::21"), net.ParseIP("10.0.0.21").To4(), nil}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	got, err := CertifyAgent(ca, "gpu-r1-u01", ips, pub)
	if err != nil {
		t.Fatal(err)
	}
	want := mustIssue(t)(IssueAgent(ca, "gpu-r1-u01", ips)).Cert
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"subject", got.Subject.String(), want.Subject.String()},
		{"DNS SANs", got.DNSNames, want.DNSNames},
		{"IP SANs", got.IPAddresses, want.IPAddresses},
		{"key usage", got.KeyUsage, want.KeyUsage},
		{"extended key usage", got.ExtKeyUsage, want.ExtKeyUsage},
		{"basic constraints", [2]bool{got.BasicConstraintsValid, got.IsCA}, [2]bool{want.BasicConstraintsValid, want.IsCA}},
		{"validity", got.NotAfter.Sub(got.NotBefore), want.NotAfter.Sub(want.NotBefore)},
		{"role", RoleOf(got), RoleAgents},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("%s: %v; IssueAgent gives %v", f.name, f.got, f.want)
		}
	}
	if k, ok := got.PublicKey.(ed25519.PublicKey); !ok || !k.Equal(pub) {
		t.Errorf("certified key %T is not the agent's", got.PublicKey)
	}
	if err := got.CheckSignatureFrom(ca.Cert); err != nil {
		t.Errorf("not signed by the CA: %v", err)
	}
	if got.SerialNumber.Cmp(want.SerialNumber) == 0 {
		t.Error("two certificates share a serial number")
	}
	if _, err := got.Verify(x509.VerifyOptions{Roots: ca.CertPool(), DNSName: "gpu-r1-u01",
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("verify as client and server: %v", err)
	}
}

func TestCertifyRefusesBadKeys(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pub  any
		want string
	}{
		{"no key", nil, "no public key"},
		{"nil ECDSA key", (*ecdsa.PublicKey)(nil), "no public key"},
		{"short ed25519 key", ed25519.PublicKey(make([]byte, 16)), "16 bytes"},
		{"RSA key", &rsaKey.PublicKey, "ed25519 or ECDSA"},
	} {
		if _, err := CertifyAgent(ca, "gpu-r1-u01", nil, tc.pub); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error containing %q", tc.name, err, tc.want)
		}
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := CertifyAgent(ca, "Node_1", nil, pub); err == nil || !strings.Contains(err.Error(), "node name") {
		t.Errorf("bad node name: %v; want an error naming it", err)
	}
}

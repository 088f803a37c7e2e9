package clusterpki

import (
	"crypto/x509"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestAPIServerSANsNameTheVIP: the floating address is a SAN of the API server's
// certificate, when it is the endpoint (the default) and when the endpoint is another
// name; without a VIP nothing is added.
func TestAPIServerSANsNameTheVIP(t *testing.T) {
	vip := net.ParseIP("10.0.0.10")
	base := "apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: 0.0.0.0\n"
	for _, tc := range []struct {
		name, yaml string
		want       bool
	}{
		{"no vip", base, false},
		{"vip as the endpoint", base + "  vip: {address: 10.0.0.10/24, interface: eth0}\n", true},
		{"vip beside a DNS endpoint", base + "  endpoint: cp.example.org:6443\n  vip: {address: 10.0.0.10/24, interface: eth0}\n", true},
	} {
		_, ips := APIServerSANs(config(t, tc.yaml))
		if got := slices.ContainsFunc(ips, vip.Equal); got != tc.want {
			t.Errorf("%s: SANs %v hold 10.0.0.10: %v, want %v", tc.name, ips, got, tc.want)
		}
	}
}

// TestEnsureAddsTheVIP: a control plane whose cluster.yaml gains a VIP gets a serving
// certificate for it from the same CA on the next init (Ensure reissues a leaf that
// does not cover every wanted SAN).
func TestEnsureAddsTheVIP(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	base := "apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: 0.0.0.0\n"
	set, err := Ensure(dir, config(t, base))
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: set.CA.CertPool(), DNSName: "10.0.0.10"}
	api, err := pki.LoadKeyPair(set.Path(APIServerCert), set.Path(APIServerKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Cert.Verify(opts); err == nil {
		t.Fatal("the certificate names 10.0.0.10 before any VIP")
	}
	if _, err := Ensure(dir, config(t, base+"  vip: {address: 10.0.0.10/24, interface: eth0}\n")); err != nil {
		t.Fatal(err)
	}
	api, err = pki.LoadKeyPair(set.Path(APIServerCert), set.Path(APIServerKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Cert.Verify(opts); err != nil {
		t.Errorf("the serving certificate does not cover the VIP after init with it: %v", err)
	}
}

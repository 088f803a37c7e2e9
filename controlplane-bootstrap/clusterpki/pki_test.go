package clusterpki

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/internal/pki"
)

func config(t *testing.T, yaml string) *clusterconfig.Config {
	t.Helper()
	cfg, err := clusterconfig.Parse("t.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestEnsureCreatesKubeadmLayoutAndKeepsIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	cfg := config(t, "apiServer:\n  certSANs: [cp.example.com, 192.0.2.7]\n")
	set, err := Ensure(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CACert, CAKey, FrontProxyCACert, EtcdCACert, SAKey, SAPub, EncryptionKey,
		APIServerCert, APIServerKubeletCert, APIServerEtcdCert, FrontProxyClientCert, EtcdServerCert, EtcdPeerCert, EtcdHealthcheckCert} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if st, _ := os.Stat(filepath.Join(dir, CAKey)); st.Mode().Perm() != 0o600 {
		t.Errorf("ca.key mode %v", st.Mode())
	}
	if len(set.EncryptionKey) != 44 {
		t.Errorf("encryption key %q is not base64 of 32 bytes", set.EncryptionKey)
	}
	api, err := pki.LoadKeyPair(set.Path(APIServerCert), set.Path(APIServerKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"kubernetes.default.svc.cluster.local", "cp.example.com", "localhost"} {
		if !slices.Contains(api.Cert.DNSNames, d) {
			t.Errorf("apiserver cert lacks SAN %s: %v", d, api.Cert.DNSNames)
		}
	}
	if _, err := api.Cert.Verify(x509.VerifyOptions{Roots: set.CA.CertPool(), DNSName: "192.0.2.7"}); err != nil {
		t.Errorf("apiserver cert for 192.0.2.7: %v", err)
	}
	if _, err := api.Cert.Verify(x509.VerifyOptions{Roots: set.CA.CertPool(), DNSName: "10.96.0.1"}); err != nil {
		t.Errorf("apiserver cert for the service IP: %v", err)
	}
	etcd, _ := pki.LoadKeyPair(set.Path(EtcdServerCert), set.Path(EtcdServerKey))
	if etcd.Cert.CheckSignatureFrom(set.EtcdCA.Cert) != nil {
		t.Error("etcd server cert not from the etcd CA")
	}

	// Again: nothing changes.
	caBefore, _ := os.ReadFile(filepath.Join(dir, CACert))
	apiBefore, _ := os.ReadFile(filepath.Join(dir, APIServerCert))
	if _, err := Ensure(dir, cfg); err != nil {
		t.Fatal(err)
	}
	caAfter, _ := os.ReadFile(filepath.Join(dir, CACert))
	apiAfter, _ := os.ReadFile(filepath.Join(dir, APIServerCert))
	if !bytes.Equal(caBefore, caAfter) || !bytes.Equal(apiBefore, apiAfter) {
		t.Error("a second Ensure changed certificates")
	}

	// A new SAN reissues the serving certificate from the same CA; a
	// deleted leaf comes back.
	os.Remove(filepath.Join(dir, FrontProxyClientCert))
	cfg2 := config(t, "apiServer:\n  certSANs: [cp.example.com, 192.0.2.7, lb.example.com]\n")
	if _, err := Ensure(dir, cfg2); err != nil {
		t.Fatal(err)
	}
	api2, _ := pki.LoadKeyPair(set.Path(APIServerCert), set.Path(APIServerKey))
	if !slices.Contains(api2.Cert.DNSNames, "lb.example.com") {
		t.Error("new SAN not in the reissued certificate")
	}
	if _, err := os.Stat(filepath.Join(dir, FrontProxyClientCert)); err != nil {
		t.Error("deleted leaf not reissued")
	}
	caAfter2, _ := os.ReadFile(filepath.Join(dir, CACert))
	if !bytes.Equal(caBefore, caAfter2) {
		t.Error("the CA changed")
	}
}

func TestIncompletePKIIsAnErrorNotARegeneration(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	cfg := config(t, "")
	if _, err := Ensure(dir, cfg); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, CAKey))
	_, err := Ensure(dir, cfg)
	if err == nil || !strings.Contains(err.Error(), "incomplete") || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("err %v", err)
	}
}

func TestEnsureKubeconfig(t *testing.T) {
	dir := t.TempDir()
	set, err := Ensure(filepath.Join(dir, "pki"), config(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, AdminKubeconfig)
	if err := set.EnsureKubeconfig(path, "c", "https://127.0.0.1:6443", AdminUser, AdminGroup); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(path)
	if err := set.EnsureKubeconfig(path, "c", "https://127.0.0.1:6443", AdminUser, AdminGroup); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(path)
	if !bytes.Equal(first, second) {
		t.Error("an up-to-date kubeconfig was rewritten")
	}
	if err := set.EnsureKubeconfig(path, "c", "https://127.0.0.1:7443", AdminUser, AdminGroup); err != nil {
		t.Fatal(err)
	}
	third, _ := os.ReadFile(path)
	if !bytes.Contains(third, []byte("https://127.0.0.1:7443")) {
		t.Error("a kubeconfig for another server was not rewritten")
	}
}

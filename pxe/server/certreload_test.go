package server

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestServerCertificateReload: the serving certificate is read again once its files
// change; a half-replaced pair (the new key beside the old certificate) and a pair
// from another CA are refused with a log line and the one in use is kept; the whole
// new pair is taken.
func TestServerCertificateReload(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "gpurack CA"})
	issue := func(ca *pki.CA, host string) *pki.KeyPair {
		kp, err := pki.IssueServer(ca, []string{host})
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	first := issue(ca, "gpuboot-a.example.test")
	if err := pki.SaveKeyPair(certPath, keyPath, first); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	s, err := loadServerCertificate(certPath, keyPath, ca.Cert, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	serving := func() string {
		time.Sleep(certCheckEvery + 100*time.Millisecond)
		c, _ := s.GetCertificate(nil)
		return c.Leaf.DNSNames[0]
	}

	second := issue(ca, "gpuboot-b.example.test")
	keyPEM, _ := pki.EncodeKeyPEM(second.Key)
	os.WriteFile(keyPath, keyPEM, 0o600) // the key is replaced first; the certificate not yet
	if got := serving(); got != "gpuboot-a.example.test" || !strings.Contains(log.String(), "does not load") {
		t.Fatalf("half-replaced pair: serving %s, log %q; want the old certificate and a warning", got, log.String())
	}
	os.WriteFile(certPath, pki.EncodeCertPEM(second.Cert), 0o644)
	if got := serving(); got != "gpuboot-b.example.test" || !strings.Contains(log.String(), "server certificate reloaded") {
		t.Fatalf("whole new pair: serving %s, log %q", got, log.String())
	}

	other, _ := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	if err := pki.SaveKeyPair(certPath, keyPath, issue(other, "gpuboot-c.example.test")); err != nil {
		t.Fatal(err)
	}
	if got := serving(); got != "gpuboot-b.example.test" || !strings.Contains(log.String(), "not issued by the gpurack CA") {
		t.Fatalf("another CA's pair: serving %s, log %q", got, log.String())
	}
	if _, err := loadServerCertificate(certPath, keyPath, ca.Cert, slog.Default()); err == nil || !strings.Contains(err.Error(), certPath) {
		t.Errorf("start with another CA's certificate: %v; want an error naming %s", err, certPath)
	}
}

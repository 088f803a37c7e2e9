package clusterpki

import (
	"crypto/x509"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestMonitoringClientCertificate: the metrics server's scrape certificate is a client
// certificate of the cluster CA with the CN gpuagent's /metrics allows and the SAN
// node_exporter's web configuration allows (decision 0693), and a certificate from
// before the SAN (an earlier init) is issued again with it.
func TestMonitoringClientCertificate(t *testing.T) {
	if MonitoringUser != metricsauth.MonitoringCN || MonitoringSAN != metricsauth.MonitoringSAN {
		t.Fatalf("clusterpki names %q/%q, the agent allows %q/%q", MonitoringUser, MonitoringSAN, metricsauth.MonitoringCN, metricsauth.MonitoringSAN)
	}
	dir := filepath.Join(t.TempDir(), "pki")
	cfg := config(t, "")
	set, err := Ensure(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	check := func() *x509.Certificate {
		kp, err := pki.LoadKeyPair(filepath.Join(dir, MonitoringClientCert), filepath.Join(dir, MonitoringClientKey))
		if err != nil {
			t.Fatal(err)
		}
		g := &metricsauth.Gate{}
		if err := g.SetCA(set.CACertPEM()); err != nil {
			t.Fatal(err)
		}
		if err := g.Verify([][]byte{kp.Cert.Raw}); err != nil {
			t.Errorf("gpuagent's gate refuses the monitoring certificate: %v", err)
		}
		if !slices.Contains(kp.Cert.DNSNames, MonitoringSAN) {
			t.Errorf("monitoring certificate SANs %v lack %s", kp.Cert.DNSNames, MonitoringSAN)
		}
		return kp.Cert
	}
	check()
	// An earlier init's certificate, without the SAN.
	old, err := set.CA.Issue(pki.CertRequest{CommonName: MonitoringUser, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveKeyPair(filepath.Join(dir, MonitoringClientCert), filepath.Join(dir, MonitoringClientKey), old); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(dir, cfg); err != nil {
		t.Fatal(err)
	}
	if again := check(); again.SerialNumber.Cmp(old.Cert.SerialNumber) == 0 {
		t.Error("the certificate without the SAN was kept")
	}
}

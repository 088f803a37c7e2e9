package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/metricsauth"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// scrapeTLS GETs https://addr/metrics with client's certificate (nil: none), not
// verifying the agent's throwaway serving certificate (the metrics server's
// insecure_skip_verify). A status other than 200 is an error.
func scrapeTLS(addr string, client *pki.KeyPair) (string, error) {
	cfg := &tls.Config{InsecureSkipVerify: true}
	if client != nil {
		cfg.Certificates = []tls.Certificate{client.TLSCertificate()}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return string(b), err
}

// TestMetricsNeedTheMonitoringCertificate runs the simulated agent three ways and
// scrapes its /metrics over loopback TLS (decision 0693): before a join (no CA) every
// scrape is refused and the log says why; with a JoinBundle carrying the cluster CA,
// and with --metrics-client-ca in a lab, the metrics server's certificate (CN
// gpurack:monitoring, signed by that CA) reads the metrics while another CN, another
// CA, no certificate and plain HTTP are refused.
func TestMetricsNeedTheMonitoringCertificate(t *testing.T) {
	issue := func(ca *pki.CA, cn string) *pki.KeyPair {
		kp, err := ca.Issue(pki.CertRequest{CommonName: cn, Usages: []pki.Usage{pki.ClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	cluster, err := pki.NewCA(pki.CARequest{CommonName: "cluster CA"})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	monitoring, wrongCN, otherCA := issue(cluster, metricsauth.MonitoringCN), issue(cluster, "system:node:x"), issue(other, metricsauth.MonitoringCN)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pki.EncodeCertPEM(cluster.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	withCA := newPKI(t, "node-m", nil, func(b *bootv1.JoinBundle) { b.ClusterCaPem = string(pki.EncodeCertPEM(cluster.Cert)) })
	common := []string{"--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--listen", "", "--interval", "1s", "--gossip-bind", "127.0.0.1:0"}

	t.Run("no CA before the join", func(t *testing.T) {
		addr := freePort(t)
		d := startDaemon(t, nil, append(common, "--metrics-listen", addr, "--socket", filepath.Join(t.TempDir(), "a.sock"), "--key-dir", t.TempDir())...)
		waitUntil(t, 30*time.Second, "the agent serving metrics", func() bool { return strings.Contains(d.stderr.String(), "serving metrics") })
		if body, err := scrapeTLS(addr, monitoring); err == nil {
			t.Fatalf("scrape answered before the join:\n%.200s", body)
		}
		waitUntil(t, 10*time.Second, "the refusal in the log", func() bool { return strings.Contains(d.stderr.String(), "no cluster CA yet") })
	})
	for name, args := range map[string][]string{
		"JoinBundle's cluster CA": {"--join-bundle", withCA.bundle},
		"--metrics-client-ca":     {"--metrics-client-ca", caFile, "--key-dir", t.TempDir()},
	} {
		t.Run(name, func(t *testing.T) {
			addr := freePort(t)
			d := startDaemon(t, nil, append(append(common, "--metrics-listen", addr, "--socket", filepath.Join(t.TempDir(), "a.sock")), args...)...)
			var body string
			waitUntil(t, 30*time.Second, "the monitoring certificate's scrape", func() bool {
				body, err = scrapeTLS(addr, monitoring)
				return err == nil && strings.Contains(body, "gpurack_gpu_temperature_celsius{")
			})
			for what, kp := range map[string]*pki.KeyPair{"another CN": wrongCN, "another CA": otherCA, "no certificate": nil} {
				if _, err := scrapeTLS(addr, kp); err == nil {
					t.Errorf("%s: scrape answered", what)
				}
			}
			if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Error("plain HTTP answered 200")
				}
			}
			waitUntil(t, 10*time.Second, "the refused CN in the log", func() bool {
				return strings.Contains(d.stderr.String(), `CN \"system:node:x\" may not scrape`) || strings.Contains(d.stderr.String(), `CN "system:node:x" may not scrape`)
			})
		})
	}
	t.Run("flags that cannot go together", func(t *testing.T) {
		_, stderr, code := runAgent(t, append(append([]string{"run"}, common...), "--metrics-listen", freePort(t), "--metrics-plaintext", "--metrics-client-ca", caFile)...)
		if code != 2 || !strings.Contains(stderr, "--metrics-plaintext and --metrics-client-ca") {
			t.Errorf("exit %d, stderr:\n%s", code, stderr)
		}
	})
}

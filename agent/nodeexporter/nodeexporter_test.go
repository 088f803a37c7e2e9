package nodeexporter

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
)

func TestRenderWebConfig(t *testing.T) {
	b, err := RenderWebConfig([]string{metricsauth.MonitoringSAN})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]map[string]any
	if err := yaml.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	tc := got["tls_server_config"]
	for k, want := range map[string]any{"cert_file": CertFile, "key_file": KeyFile, "client_ca_file": ClientCAFile,
		"client_auth_type": "RequireAndVerifyClientCert", "min_version": "TLS12"} {
		if tc[k] != want {
			t.Errorf("%s: %v, want %v\n%s", k, tc[k], want, b)
		}
	}
	if sans, _ := tc["client_allowed_sans"].([]any); len(sans) != 1 || sans[0] != metricsauth.MonitoringSAN {
		t.Errorf("client_allowed_sans: %v", tc["client_allowed_sans"])
	}
	if b, _ := RenderWebConfig(nil); strings.Contains(string(b), "client_allowed_sans") {
		t.Errorf("no SANs still restricts them:\n%s", b)
	}
	if _, err := RenderWebConfig([]string{"a\nb"}); err == nil {
		t.Error("a SAN over two lines accepted")
	}
}

func TestWriteRefuses(t *testing.T) {
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "ca"})
	kp, err := metricsauth.ServingCert("n", []string{"n"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pki.EncodeCertPEM(ca.Cert)
	for name, f := range map[string]Files{
		"no CA":             {Serving: kp},
		"CA not PEM":        {ClusterCAPEM: []byte("x"), Serving: kp},
		"no serving cert":   {ClusterCAPEM: caPEM},
		"listen not a port": {ClusterCAPEM: caPEM, Serving: kp, Listen: "9100"},
		"listen injects":    {ClusterCAPEM: caPEM, Serving: kp, Listen: ":9100\nEVIL=1"},
	} {
		if err := Write(t.TempDir(), f); err == nil {
			t.Errorf("%s: written", name)
		}
	}
	dir := t.TempDir()
	if err := Write(dir, Files{ClusterCAPEM: caPEM, Serving: kp}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v", st, err)
	}
	if env, _ := os.ReadFile(filepath.Join(dir, EnvFile)); string(env) != "LISTEN="+DefaultListen+"\n" {
		t.Errorf("env file: %q", env)
	}
}

// TestNodeExporterWithWebConfig runs the real node_exporter (make k8s-bins) with the
// files Write lays out and scrapes it over loopback: the metrics server's certificate
// (CN gpurack:monitoring, SAN gpurack-monitoring, signed by the cluster CA) gets the
// metrics; no certificate, one without the SAN, one from another CA and plain HTTP
// are refused.
func TestNodeExporterWithWebConfig(t *testing.T) {
	bin, err := components.FindBinary(components.BinDir(""), "node_exporter")
	if err != nil {
		testreq.Missing(t, err.Error(), "make k8s-bins builds node_exporter v1.12.1")
	}
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "cluster CA"})
	other, _ := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	issue := func(ca *pki.CA, sans ...string) *pki.KeyPair {
		kp, err := ca.Issue(pki.CertRequest{CommonName: metricsauth.MonitoringCN, DNSNames: sans, Usages: []pki.Usage{pki.ClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	monitoring, noSAN, otherCA := issue(ca, metricsauth.MonitoringSAN), issue(ca), issue(other, metricsauth.MonitoringSAN)
	serving, err := metricsauth.ServingCert("gpu-1", []string{"gpu-1"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	dir := t.TempDir()
	if err := Write(dir, Files{ClusterCAPEM: pki.EncodeCertPEM(ca.Cert), Serving: serving, AllowedSANs: []string{metricsauth.MonitoringSAN}, Listen: addr}); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "node_exporter.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--web.config.file="+filepath.Join(dir, WebConfigFile), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait(); log.Close() })

	var body string
	deadline := time.Now().Add(30 * time.Second)
	for body, err = get(addr, monitoring); err != nil && time.Now().Before(deadline); body, err = get(addr, monitoring) {
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		out, _ := os.ReadFile(log.Name())
		t.Fatalf("the monitoring certificate's scrape: %v\nnode_exporter's log:\n%s", err, out)
	}
	for _, want := range []string{`node_exporter_build_info{`, `version="1.12.1"`, "node_filesystem_avail_bytes{", "node_memory_MemTotal_bytes "} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %q", want)
		}
	}
	for name, kp := range map[string]*pki.KeyPair{"no certificate": nil, "no SAN": noSAN, "another CA": otherCA} {
		if _, err := get(addr, kp); err == nil {
			t.Errorf("%s: node_exporter answered", name)
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP answered 200")
		}
	}
}

// get scrapes https://addr/metrics with client's certificate (nil: none), not
// verifying the server (as the metrics server does: insecure_skip_verify). A status
// other than 200 is an error.
func get(addr string, client *pki.KeyPair) (string, error) {
	cfg := &tls.Config{InsecureSkipVerify: true}
	if client != nil {
		cfg.Certificates = []tls.Certificate{client.TLSCertificate()}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

package server_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/pxe/server"
)

// metricsClient is an HTTPS client with a metrics-reader certificate, issued by
// `gpuboot certs operator prometheus --level metrics-reader` the first time.
func (in *instance) metricsClient() *http.Client {
	in.t.Helper()
	if in.metrics != nil {
		return in.metrics
	}
	state := filepath.Join(in.dir, "state")
	if out := in.run("certs", "operator", "prometheus", "--state-dir", state, "--level", "metrics-reader"); !strings.Contains(out, "(level metrics-reader)") {
		in.t.Fatalf("certs operator --level metrics-reader:\n%s", out)
	}
	in.metrics = operatorClient(in.t, filepath.Join(state, "operators", "prometheus"))
	return in.metrics
}

// operatorClient is an HTTPS client with the operator credentials in dir; it does not
// verify gpuboot (the tests pin nothing here).
func operatorClient(t *testing.T, dir string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, server.OperatorCertFile), filepath.Join(dir, server.OperatorKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
}

// scrapeMetrics reads gpuboot's /metrics on its TLS port with the metrics-reader
// certificate.
func (in *instance) scrapeMetrics() string {
	in.t.Helper()
	code, body := get(in.t, in.metricsClient(), "https://"+in.tlsAddr+"/metrics")
	if code != http.StatusOK {
		in.t.Fatalf("GET /metrics as metrics-reader: %d %s", code, body)
	}
	return body
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsReaderOnGpuboot: against a running gpuboot, /metrics is on the operator
// TLS port for a metrics-reader certificate alone (decision 0693): the admin's
// certificate and a token are refused, and the metrics-reader can read no machine;
// the plain HTTP port has no /metrics unless metrics.plainHTTP says so; --token is
// refused with the level.
func TestMetricsReaderOnGpuboot(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	state := filepath.Join(in.dir, "state")
	if out, err := exec.Command(in.bin, "certs", "operator", "p2", "--state-dir", state, "--level", "metrics-reader", "--token").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "cannot read /metrics") {
		t.Errorf("certs operator --level metrics-reader --token: %v\n%s", err, out)
	}
	if body := in.scrapeMetrics(); !strings.Contains(body, "gpurack_certificate_expiry_timestamp_seconds{component=\"gpuboot\",name=\"ca\"}") {
		t.Errorf("/metrics lacks gpuboot's CA expiry:\n%.500s", body)
	}
	if code, body := get(t, operatorClient(t, in.creds), "https://"+in.tlsAddr+"/metrics"); code != http.StatusForbidden || !strings.Contains(body, "metrics-reader") {
		t.Errorf("/metrics as admin: %d %s, want 403 naming metrics-reader", code, body)
	}
	if code, _ := get(t, &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}, "https://"+in.tlsAddr+"/metrics"); code != http.StatusUnauthorized {
		t.Errorf("/metrics with no credential: %d, want 401", code)
	}
	if code, _ := get(t, in.metricsClient(), "https://"+in.tlsAddr+"/api/v1/machines"); code != http.StatusForbidden {
		t.Errorf("machines as metrics-reader: %d, want 403", code)
	}
	if code, _ := get(t, http.DefaultClient, "http://"+in.httpAddr+"/metrics"); code != http.StatusNotFound {
		t.Errorf("plain HTTP /metrics by default: %d, want 404", code)
	}

	plain := newInstance(t, "metrics: {plainHTTP: true}\n")
	plain.start()
	if code, body := get(t, http.DefaultClient, "http://"+plain.httpAddr+"/metrics"); code != http.StatusOK || !strings.Contains(body, "gpuboot_") {
		t.Errorf("plain HTTP /metrics with metrics.plainHTTP: %d %.200s", code, body)
	}
	if body := plain.scrapeMetrics(); !strings.Contains(body, "gpuboot_") {
		t.Errorf("TLS /metrics with metrics.plainHTTP too: %.200s", body)
	}
}

package server_test

import (
	"bytes"
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

// TestAlertSenderOnGpuboot: against a running gpuboot, an alert-sender certificate
// from `gpuboot certs operator NAME --level alert-sender` posts Alertmanager's
// notification to POST /api/v1/alerts over mutual TLS and can do nothing else (no
// machine list); `--token` is refused with that level. The alert shows in `gpuboot rack
// report` and is still there after a restart (STATEDIR/alerts.json).
func TestAlertSenderOnGpuboot(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	state := filepath.Join(in.dir, "state")
	if out, err := exec.Command(in.bin, "certs", "operator", "am", "--state-dir", state, "--level", "alert-sender", "--token").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "a token acts as a viewer") {
		t.Errorf("certs operator --level alert-sender --token: %v\n%s", err, out)
	}
	out := in.run("certs", "operator", "alertmanager", "--state-dir", state, "--level", "alert-sender")
	if !strings.Contains(out, "(level alert-sender)") {
		t.Fatalf("certs operator --level alert-sender:\n%s", out)
	}
	creds := filepath.Join(state, "operators", "alertmanager")
	cert, err := tls.LoadX509KeyPair(filepath.Join(creds, server.OperatorCertFile), filepath.Join(creds, server.OperatorKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
	body := `{"version":"4","receiver":"gpuboot","status":"firing","alerts":[{"status":"firing",
"labels":{"alertname":"GpurackAPIServerErrors","severity":"warning"},"annotations":{"summary":"the API server answers 5xx"},
"startsAt":"2026-12-04T10:00:00Z","endsAt":"0001-01-01T00:00:00Z","fingerprint":"0123456789abcdef"}]}`
	resp, err := client.Post("https://"+in.tlsAddr+"/api/v1/alerts", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	reply, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/v1/alerts: %s: %s", resp.Status, reply)
	}
	if b, err := exec.Command(in.bin, "machines", "list", "--server", in.tlsAddr, "--credentials", creds).CombinedOutput(); err == nil ||
		!strings.Contains(string(b), "needs operator level viewer") {
		t.Errorf("machines list as alert-sender: %v\n%s", err, b)
	}
	for _, when := range []string{"running", "after a restart"} {
		if rep := in.cli("rack", "report", "r1"); !strings.Contains(rep, "GpurackAPIServerErrors") || !strings.Contains(rep, "cluster-wide") {
			t.Errorf("rack report %s lacks the cluster-wide alert:\n%s", when, rep)
		}
		in.stop()
		in.start()
	}
}

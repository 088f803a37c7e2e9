package alerting

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/admin/admintest"
	"github.com/gpurack/gpurack/pxe/alerts"
)

// gpuboot is a real gpuboot operator surface (pxe/admin over the enrollment service
// and a bbolt inventory, with an alert store in its state folder) on a loopback HTTPS
// port that asks for client certificates of the gpurack CA, as gpuboot's TLS port
// does. Machine m1 is approved as node gpu-0001 in rack r1.
type gpuboot struct {
	target *gpubootTarget
	viewer *http.Client // an operator client with a viewer certificate
	url    string
}

func startGpuboot(t *testing.T) *gpuboot {
	t.Helper()
	a := admintest.Start(t, func(dir string, c *admin.Config) {
		c.Alerts = alerts.Open(filepath.Join(dir, "alerts.json"), 0, nil)
	}, "gpu-0001")
	g := &gpuboot{url: a.URL, target: &gpubootTarget{url: a.URL + "/api/v1/alerts"}}
	g.target.caFile, g.target.certFile, g.target.keyFile = credential(t, a.CA, "alertmanager", pki.LevelAlertSender)
	viewer, err := pki.IssueOperatorLevel(a.CA, "val", pki.LevelViewer)
	if err != nil {
		t.Fatal(err)
	}
	g.viewer = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: admintest.Pool(a.CA.Cert), Certificates: []tls.Certificate{viewer.TLSCertificate()}}}}
	return g
}

// credential writes an operator credential at level as `gpuboot certs operator`
// does (ca.crt, operator.crt, operator.key) and returns the three paths.
func credential(t *testing.T, ca *pki.CA, name string, level pki.OperatorLevel) (caFile, certFile, keyFile string) {
	t.Helper()
	kp, err := pki.IssueOperatorLevel(ca, name, level)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "operator.crt"), filepath.Join(dir, "operator.key")
	if err := os.WriteFile(caFile, pki.EncodeCertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveKeyPair(certFile, keyFile, kp); err != nil {
		t.Fatal(err)
	}
	return caFile, certFile, keyFile
}

// reportAlerts reads rack r1's report over REST as a viewer and returns its alerts.
func (g *gpuboot) reportAlerts(t *testing.T) []map[string]any {
	t.Helper()
	resp, err := g.viewer.Get(g.url + "/api/v1/racks/r1/report?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the rack report: %s: %s", resp.Status, body)
	}
	var d struct {
		Alerts []map[string]any `json:"alerts"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("the rack report: %v\n%s", err, body)
	}
	return d.Alerts
}

// TestAlertmanagerToGpuboot: the real Alertmanager, with the shipped configuration,
// delivers to a real gpuboot operator port over mutual TLS with an alert-sender
// certificate; the rack report then lists the alert on its machine, with its severity,
// GPU, summary and runbook, and resolving the alert takes it off.
func TestAlertmanagerToGpuboot(t *testing.T) {
	rules := shippedRules(t)
	g := startGpuboot(t)
	a := startAlertmanager(t, g.target)
	sent := fromRule(t, rules, "GpurackECCUncorrected", "Hostname", "gpu-0001", "gpu", "3", "UUID", "GPU-3f1c")
	sent.Annotations["summary"] = "Uncorrected ECC errors on gpu-0001 GPU 3"
	a.post(t, sent)
	var got []map[string]any
	waitFor(t, deadline, "GpurackECCUncorrected in rack r1's report", func() bool {
		got = g.reportAlerts(t)
		return len(got) > 0
	})
	want := map[string]string{"name": "GpurackECCUncorrected", "severity": sent.Labels["severity"], "nodeName": "gpu-0001", "gpu": "3",
		"gpuUuid": "GPU-3f1c", "summary": sent.Annotations["summary"], "runbookUrl": sent.Annotations["runbook_url"]}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("the report's alert has %s %v, want %q: %v", k, got[0][k], v, got[0])
		}
	}
	if got[0]["machineId"] == "" || got[0]["since"] == "" || got[0]["clusterWide"] == true {
		t.Errorf("the report's alert is not placed on gpu-0001's machine with its start: %v", got[0])
	}
	if n := a.metric(t, "alertmanager_notifications_failed_total", `receiver="gpuboot"`); n != 0 {
		t.Errorf("alertmanager_notifications_failed_total{receiver=\"gpuboot\"} is %v", n)
	}
	ended := sent
	ended.EndsAt = time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	a.post(t, ended)
	waitFor(t, deadline, "the resolved GpurackECCUncorrected to leave the report", func() bool { return len(g.reportAlerts(t)) == 0 })
}

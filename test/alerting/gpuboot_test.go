package alerting

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/alerts"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
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
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(dir, "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	revoked := pki.NewRevocationList()
	svc, err := enroll.New(context.Background(), enroll.Config{Store: store, CA: ca, Revocations: revoked, Policy: policy.Policy{Mode: policy.Manual},
		Racks: map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: strings.Repeat("a", 40)}}, DefaultRack: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.New(admin.Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1"},
		Alerts: alerts.Open(filepath.Join(dir, "alerts.json"), 0, nil)})
	if err != nil {
		t.Fatal(err)
	}
	approve(t, ca, svc, srv)
	serving, err := pki.IssueServer(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serving.TLSCertificate()},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool(ca.Cert)}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	g := &gpuboot{url: hs.URL, target: &gpubootTarget{url: hs.URL + "/api/v1/alerts"}}
	g.target.caFile, g.target.certFile, g.target.keyFile = credential(t, ca, "alertmanager", pki.LevelAlertSender)
	viewer, err := pki.IssueOperatorLevel(ca, "val", pki.LevelViewer)
	if err != nil {
		t.Fatal(err)
	}
	g.viewer = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool(ca.Cert), Certificates: []tls.Certificate{viewer.TLSCertificate()}}}}
	return g
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// approve registers a machine and approves it as gpu-0001, as an operator would.
func approve(t *testing.T, ca *pki.CA, svc *enroll.Service, srv *admin.Server) {
	t.Helper()
	id, _ := identity.New("52:54:00:00:00:71", "", "SN71")
	if _, err := svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.71")); err != nil {
		t.Fatal(err)
	}
	op, err := pki.IssueOperatorLevel(ca, "olga", pki.LevelOperator)
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{op.Cert}}}})
	if _, err := srv.Approve(ctx, &bootv1.ApproveRequest{Machine: id.MAC, NodeName: "gpu-0001", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
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

package admin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/alerts"
	"github.com/gpurack/gpurack/pxe/identity"
)

// alertsRig is the operator surface over the real enrollment service with an alert
// store in t.TempDir, one machine approved as gpu-r1-u01 in rack r1, and a certificate
// of each level.
type alertsRig struct {
	srv   *Server
	store *alerts.Store
	certs map[pki.OperatorLevel]*x509.Certificate
	token string
}

func newAlertsRig(t *testing.T) *alertsRig {
	t.Helper()
	ca, inv, svc := overEnrollment(t, pki.NewRevocationList())
	tok, line, err := NewToken("tess", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	tokensFile := filepath.Join(t.TempDir(), "operator-tokens")
	if err := os.WriteFile(tokensFile, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := LoadTokens(tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	r := &alertsRig{store: alerts.Open(filepath.Join(t.TempDir(), "alerts.json"), 0, nil), certs: map[pki.OperatorLevel]*x509.Certificate{}, token: tok}
	r.srv, err = New(Config{Lifecycle: svc, Inventory: inv, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1"}, Tokens: tokens, Alerts: r.store})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range append(append([]pki.OperatorLevel(nil), pki.Levels...), pki.SeparateLevels...) {
		kp, err := pki.IssueOperatorLevel(ca, l.Name(), l)
		if err != nil {
			t.Fatal(err)
		}
		r.certs[l] = kp.Cert
	}
	id, _ := identity.New("52:54:00:00:00:51", "", "SN51")
	if _, err := svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.51")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.srv.Approve(asPeer(context.Background(), r.certs[pki.LevelOperator]), &bootv1.ApproveRequest{Machine: id.MAC, NodeName: "gpu-r1-u01"}); err != nil {
		t.Fatal(err)
	}
	return r
}

// do serves one request as the holder of level's certificate ("": none; "token": the
// bearer token).
func (r *alertsRig) do(method, path string, level pki.OperatorLevel, body []byte, contentType string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	switch {
	case level == "token":
		req.Header.Set("Authorization", "Bearer "+r.token)
	case level != "":
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{r.certs[level]}}
	}
	rec := httptest.NewRecorder()
	r.srv.Handler().ServeHTTP(rec, req)
	return rec
}

func notification(status string, kv ...string) []byte {
	labels := `"alertname":"GpurackXIDFatal","severity":"critical","Hostname":"gpu-r1-u01","gpu_index":"3"`
	for i := 0; i+1 < len(kv); i += 2 {
		labels += fmt.Sprintf(",%q:%q", kv[i], kv[i+1])
	}
	return []byte(`{"version":"4","receiver":"gpuboot","status":"` + status + `","alerts":[{"status":"` + status + `","labels":{` + labels +
		`},"annotations":{"summary":"Fatal XID on gpu-r1-u01 GPU 3","runbook_url":"https://docs.example/operations.md#xid"},` +
		`"startsAt":"2026-12-04T10:00:00Z","endsAt":"0001-01-01T00:00:00Z","fingerprint":"1cee2732d28febcb"}]}`)
}

// TestAlertsWebhookLevels: only an alert-sender certificate posts alerts; viewers,
// operators, admins and tokens are refused (403), and no credential is 401.
func TestAlertsWebhookLevels(t *testing.T) {
	r := newAlertsRig(t)
	for _, tt := range []struct {
		level pki.OperatorLevel
		code  int
	}{
		{"", http.StatusUnauthorized},
		{"token", http.StatusForbidden},
		{pki.LevelViewer, http.StatusForbidden},
		{pki.LevelOperator, http.StatusForbidden},
		{pki.LevelAdmin, http.StatusForbidden},
		{pki.LevelAlertSender, http.StatusOK},
	} {
		rec := r.do("POST", "/api/v1/alerts", tt.level, notification("firing"), "application/json")
		if rec.Code != tt.code {
			t.Errorf("POST /api/v1/alerts as %q: %d %s; want %d", tt.level, rec.Code, rec.Body, tt.code)
		}
		if tt.code == http.StatusForbidden && tt.level != "token" && !strings.Contains(rec.Body.String(), "--level alert-sender") {
			t.Errorf("the refusal of %q does not say which level to ask for: %s", tt.level, rec.Body)
		}
	}
	if n := len(r.store.Active(time.Now())); n != 1 {
		t.Errorf("%d alerts kept after one accepted notification", n)
	}
}

// TestAlertSenderReachesNothingElse: an alert-sender certificate is refused on every
// other route of the table and on every AdminService method.
func TestAlertSenderReachesNothingElse(t *testing.T) {
	r := newAlertsRig(t)
	requireOnly(t, r, Caller{Name: "alertmanager", Level: pki.LevelAlertSender}, routeAlerts)
	ctx := asPeer(context.Background(), r.certs[pki.LevelAlertSender])
	if _, err := r.srv.ListMachines(ctx, &bootv1.ListMachinesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListMachines as alert-sender: %v", err)
	}
	if _, err := r.srv.Approve(ctx, &bootv1.ApproveRequest{Machine: "gpu-r1-u01"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Approve as alert-sender: %v", err)
	}
}

// TestAlertsInRackReport: a firing alert shows in the rack report (gRPC data, REST
// JSON and Markdown, the rack view) on its machine; resolving it removes it.
func TestAlertsInRackReport(t *testing.T) {
	r := newAlertsRig(t)
	if rec := r.do("POST", "/api/v1/alerts", pki.LevelAlertSender, notification("firing", "UUID", "GPU-3"), "application/json"); rec.Code != 200 ||
		!strings.Contains(rec.Body.String(), `"firing":1`) {
		t.Fatalf("POST: %d %s", rec.Code, rec.Body)
	}
	viewer := asPeer(context.Background(), r.certs[pki.LevelViewer])
	rep, err := r.srv.RackReport(viewer, &bootv1.RackReportRequest{Rack: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	as := rep.GetData().GetAlerts()
	if len(as) != 1 || as[0].GetName() != "GpurackXIDFatal" || as[0].GetNodeName() != "gpu-r1-u01" || as[0].GetMachineId() == "" ||
		as[0].GetGpu() != "3" || as[0].GetGpuUuid() != "GPU-3" || as[0].GetRunbookUrl() == "" || as[0].GetSince().AsTime().Hour() != 10 {
		t.Fatalf("report alerts: %v", as)
	}
	if !strings.Contains(string(rep.GetContent()), "## Active alerts (1)") {
		t.Errorf("markdown report:\n%s", rep.GetContent())
	}
	for path, want := range map[string]string{
		"/api/v1/racks/r1/report?format=json": `"name": "GpurackXIDFatal"`,
		"/racks/r1":                           "Fatal XID on gpu-r1-u01 GPU 3",
	} {
		if rec := r.do("GET", path, pki.LevelViewer, nil, ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d, lacks %q:\n%s", path, rec.Code, want, rec.Body)
		}
	}
	if rec := r.do("POST", "/api/v1/alerts", pki.LevelAlertSender, notification("resolved"), "application/json"); rec.Code != 200 {
		t.Fatalf("POST resolved: %d %s", rec.Code, rec.Body)
	}
	if rep, err := r.srv.RackReport(viewer, &bootv1.RackReportRequest{Rack: "r1"}); err != nil || len(rep.GetData().GetAlerts()) != 0 {
		t.Errorf("after resolving: %v %v", rep.GetData().GetAlerts(), err)
	}
}

// TestAlertsWebhookRefusesBadBodies: each bad request gets its status and a message
// that says what is wrong.
func TestAlertsWebhookRefusesBadBodies(t *testing.T) {
	r := newAlertsRig(t)
	big := append([]byte(`{"version":"4","status":"firing","receiver":"`), bytes.Repeat([]byte("x"), alerts.MaxBody)...)
	for _, tt := range []struct {
		name, method, ct string
		body             []byte
		code             int
		want             string
	}{
		{"too large", "POST", "application/json", big, http.StatusRequestEntityTooLarge, "larger than 1048576 bytes"},
		{"not JSON", "POST", "application/json", []byte("hello"), http.StatusBadRequest, "not JSON"},
		{"version 3", "POST", "application/json", []byte(`{"version":"3","status":"firing"}`), http.StatusBadRequest, `webhook version "3"`},
		{"form", "POST", "application/x-www-form-urlencoded", notification("firing"), http.StatusUnsupportedMediaType, "application/json"},
		{"GET", "GET", "", nil, http.StatusMethodNotAllowed, ""},
	} {
		rec := r.do(tt.method, "/api/v1/alerts", pki.LevelAlertSender, tt.body, tt.ct)
		if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.want) {
			t.Errorf("%s: %d %q; want %d with %q", tt.name, rec.Code, rec.Body, tt.code, tt.want)
		}
	}
	if n := len(r.store.Active(time.Now())); n != 0 {
		t.Errorf("refused requests left %d alerts", n)
	}
}

// requireOnly checks that c is refused every call of the levels table but allowed:
// PermissionDenied from allow, and 403 on every route through the rig.
func requireOnly(t *testing.T, r *alertsRig, c Caller, allowed string) {
	t.Helper()
	for call := range levels {
		if call == allowed {
			continue
		}
		if err := c.allow(call); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s calling %s: %v; want PermissionDenied", c.Level, call, err)
		}
		method, path, isRoute := strings.Cut(call, " ")
		if !isRoute {
			continue
		}
		path = strings.NewReplacer("{ref}", "gpu-r1-u01", "{rack}", "r1", "{$}", "").Replace(path)
		if rec := r.do(method, path, c.Level, nil, ""); rec.Code != http.StatusForbidden {
			t.Errorf("%s %s as %s: %d; want 403", method, path, c.Level, rec.Code)
		}
	}
}

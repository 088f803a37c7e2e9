package admin

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestMetricsReaderLevels: GET /metrics answers a metrics-reader certificate alone
// (decision 0693); viewers, operators, admins, the alert-sender and tokens are refused
// (403, naming the level), no credential is 401; without a registry it is 404.
func TestMetricsReaderLevels(t *testing.T) {
	r := newAlertsRig(t)
	reg := prometheus.NewRegistry()
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuboot_test_up"})
	up.Set(1)
	reg.MustRegister(up)
	r.srv.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	for _, tt := range []struct {
		level pki.OperatorLevel
		code  int
	}{
		{"", http.StatusUnauthorized},
		{"token", http.StatusForbidden},
		{pki.LevelViewer, http.StatusForbidden},
		{pki.LevelOperator, http.StatusForbidden},
		{pki.LevelAdmin, http.StatusForbidden},
		{pki.LevelAlertSender, http.StatusForbidden},
		{pki.LevelMetricsReader, http.StatusOK},
	} {
		rec := r.do("GET", "/metrics", tt.level, nil, "")
		if rec.Code != tt.code {
			t.Errorf("GET /metrics as %q: %d %s; want %d", tt.level, rec.Code, rec.Body, tt.code)
		}
		if tt.code == http.StatusForbidden && tt.level != "token" && !strings.Contains(rec.Body.String(), "--level metrics-reader") {
			t.Errorf("the refusal of %q does not say which level to ask for: %s", tt.level, rec.Body)
		}
		if tt.code == http.StatusOK && !strings.Contains(rec.Body.String(), "gpuboot_test_up 1") {
			t.Errorf("metrics-reader's scrape lacks the registry's gauge:\n%s", rec.Body)
		}
	}
	r.srv.metrics = nil
	if rec := r.do("GET", "/metrics", pki.LevelMetricsReader, nil, ""); rec.Code != http.StatusNotFound {
		t.Errorf("GET /metrics with no registry: %d", rec.Code)
	}
}

// TestMetricsReaderReachesNothingElse: a metrics-reader certificate is refused on
// every other route and AdminService method of the table.
func TestMetricsReaderReachesNothingElse(t *testing.T) {
	r := newAlertsRig(t)
	requireOnly(t, r, Caller{Name: "prometheus", Level: pki.LevelMetricsReader}, routeMetrics)
}

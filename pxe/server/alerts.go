package server

import (
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/pxe/alerts"
)

// AlertsFile is where gpuboot keeps the active alerts Alertmanager reported, in its
// state directory.
const AlertsFile = "alerts.json"

// openAlerts opens the alert store in stateDir (a corrupt file is logged and ignored)
// and registers its metrics on reg: gpuboot_alerts_active, the alerts kept, and
// gpuboot_alerts_dropped_total, those dropped to stay within alerts.DefaultLimit.
func openAlerts(stateDir string, reg prometheus.Registerer, log *slog.Logger) *alerts.Store {
	s := alerts.Open(filepath.Join(stateDir, AlertsFile), alerts.DefaultLimit, log)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuboot_alerts_active",
			Help: "Alerts Alertmanager reported firing that gpuboot keeps for the rack reports (POST /api/v1/alerts)."},
			func() float64 { return float64(s.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuboot_alerts_dropped_total",
			Help: "Alerts gpuboot dropped, the oldest first, to keep at most 10000."},
			func() float64 { return float64(s.Dropped()) }),
	)
	return s
}

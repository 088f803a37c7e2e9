package components

import (
	"net"
	"path/filepath"
	"strconv"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// The log store's components (monitoring.logs; docs/contracts.md §15, decision 0694):
// VictoriaLogs from its pinned binary, and the gateway nodes write through, which is
// controlplane-bootstrap itself (LogsGatewayCommand).
const (
	VictoriaLogs = "victoria-logs"
	LogsGateway  = "logs-gateway"
	// LogsGatewayCommand is the subcommand the gateway runs as
	// (logsgateway.Command).
	LogsGatewayCommand = "logs-gateway"
)

// LogsDir is VictoriaLogs' storage, DIR/monitoring/logs.
func (l Layout) LogsDir() string { return filepath.Join(l.Dir, "monitoring", "logs") }

// VictoriaLogsURL is VictoriaLogs' base URL on loopback, for the gateway, the logs
// command and the scrape.
func VictoriaLogsURL(cfg *clusterconfig.Config) string {
	return "http://" + hostPort("127.0.0.1", cfg.Monitoring.Logs.Port)
}

// logsSpecs are VictoriaLogs then the gateway, when the log store is on.
func logsSpecs(cfg *clusterconfig.Config, l Layout) []Component {
	if !cfg.Monitoring.LogsEnabled() {
		return nil
	}
	return []Component{victoriaLogsSpec(cfg, l), logsGatewaySpec(cfg, l)}
}

func victoriaLogsSpec(cfg *clusterconfig.Config, l Layout) Component {
	lg := cfg.Monitoring.Logs
	listen := hostPort("127.0.0.1", lg.Port)
	flags := map[string]string{
		// Loopback only: its query and delete APIs have no authentication; nodes write
		// through the gateway.
		"httpListenAddr":                   listen,
		"storageDataPath":                  l.LogsDir(),
		"retentionPeriod":                  lg.RetentionPeriod,
		"retention.maxDiskSpaceUsageBytes": lg.MaxDiskSpaceUsage,
		// Its caches take 60% of the host's memory by default; this host also runs
		// etcd, the API server and Prometheus (monitoring.logs.extraArgs overrides).
		"memory.allowedPercent": "25",
	}
	return Component{
		Name:       VictoriaLogs,
		Args:       render(flags, lg.ExtraArgs),
		Ports:      []Port{{"127.0.0.1", lg.Port, "monitoring.logs.port"}},
		HealthURL:  "http://" + listen + "/health",
		HealthText: "OK",
	}
}

func logsGatewaySpec(cfg *clusterconfig.Config, l Layout) Component {
	g := cfg.Monitoring.Logs.Gateway
	flags := map[string]string{
		"listen":                  hostPort(g.ListenAddress, g.Port),
		"upstream":                VictoriaLogsURL(cfg),
		"cert-file":               l.PKI(clusterpki.LogsGatewayCert),
		"key-file":                l.PKI(clusterpki.LogsGatewayKey),
		"client-ca-file":          l.PKI(clusterpki.CACert),
		"max-request-bytes":       strconv.FormatInt(g.MaxRequestBytes, 10),
		"max-concurrent-requests": strconv.Itoa(g.MaxConcurrentRequests),
		"max-requests-per-node":   strconv.Itoa(g.MaxRequestsPerNode),
		"metrics-user":            clusterpki.MonitoringUser,
	}
	probe := g.ListenAddress
	if ip := net.ParseIP(probe); ip == nil || ip.IsUnspecified() {
		probe = "127.0.0.1"
	}
	return Component{
		Name:      LogsGateway,
		Self:      true,
		Args:      append([]string{LogsGatewayCommand}, render(flags, nil)...),
		Ports:     []Port{{g.ListenAddress, g.Port, "monitoring.logs.gateway.port"}},
		HealthURL: "https://" + hostPort(probe, g.Port) + "/healthz",
	}
}

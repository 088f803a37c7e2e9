package node

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/gpurack/gpurack/agent/logship"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// LogShipping is how the node ships its journal and its pods' container logs to the log
// store the JoinBundle names (logs_endpoint; agent/logship). Zero values: the defaults.
type LogShipping struct {
	// PodsDir is kubelet's pod log directory; empty: /var/log/pods; "off": container
	// logs are not shipped.
	PodsDir string
	// Journalctl is the journalctl program; empty: journalctl from PATH; "off": the
	// journal is not shipped.
	Journalctl string
	// StateFile keeps the positions the store took, across agent restarts (not
	// reboots); empty: /run/gpurack/logship.json.
	StateFile string
	// MaxLine bounds one line (bytes; longer ones are cut, truncated=true); QueueLines
	// and QueueBytes bound what waits to be shipped. Zero: 64 KiB, 10,000 lines, 8 MiB.
	MaxLine, QueueLines, QueueBytes int
}

// DefaultLogStateFile is where the positions are kept: /run, so a reboot starts afresh.
const DefaultLogStateFile = "/run/gpurack/logship.json"

// logShippingService ships the node's logs (agent/logship) with kubelet's client
// certificate, which kubelet rotates; the supervisor restarts it when it fails.
type logShippingService struct {
	statusCell
	cfg logship.Config
	// certFile is kubelet's client certificate and key; caPEM the cluster CA.
	certFile string
	caPEM    []byte
}

// logShipping is the log-shipping service for bundle, or nil when the bundle names no
// logs endpoint (said once in the log: a diskless node's logs then end with its boot).
func (n *node) logShipping(bundle *bootv1.JoinBundle) *logShippingService {
	endpoint := bundle.GetLogsEndpoint()
	if endpoint == "" {
		n.log.Info("no logs endpoint in the JoinBundle (gpuboot's cluster.logsEndpoint): this node ships no logs, and its journal ends with its boot")
		return nil
	}
	lc := n.cfg.Logs
	cfg := logship.Config{URL: "https://" + endpoint, Node: bundle.GetNodeName(), BootID: logship.JournalBootID(n.cfg.FactsRoot.BootID()),
		PodsDir: orDefault(lc.PodsDir, "/var/log/pods"), Journalctl: orDefault(lc.Journalctl, "journalctl"),
		StateFile: orDefault(lc.StateFile, DefaultLogStateFile), MaxLine: lc.MaxLine, QueueLines: lc.QueueLines,
		QueueBytes: lc.QueueBytes, Metrics: &n.logs, Log: n.log.With("service", "log-shipping")}
	if cfg.PodsDir == "off" {
		cfg.PodsDir = ""
	}
	if cfg.Journalctl == "off" {
		cfg.Journalctl = ""
	}
	return &logShippingService{cfg: cfg, certFile: filepath.Join(n.cfg.KubeletDir, "pki", "kubelet-client-current.pem"),
		caPEM: []byte(bundle.GetClusterCaPem())}
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (s *logShippingService) Name() string { return "log-shipping" }

// attempt ships until ctx ends; the agent's stop ends ctx, and Run then flushes the
// queue (5 s at most, within the unit's TimeoutStopSec).
func (s *logShippingService) attempt(ctx context.Context, _ gated) error {
	tlsCfg, err := logship.ClientTLS(s.certFile, s.caPEM)
	if err != nil {
		return err
	}
	cfg := s.cfg
	cfg.TLS = tlsCfg
	s.set(Running, fmt.Sprintf("shipping the journal and container logs to %s as %s", cfg.URL, cfg.Node))
	return logship.Run(ctx, cfg)
}

package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/agent/nodeexporter"
	"github.com/gpurack/gpurack/agent/server"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/buildinfo"
)

// metricsListener serves /metrics on Config.MetricsListen; nil: none. It is TLS with
// a client certificate required (decision 0693: the metrics server's, signed by the
// cluster CA), unless Config.MetricsPlaintext.
func (n *node) metricsListener() (Service, error) {
	cfg := n.cfg
	if cfg.MetricsListen == "" {
		return nil, nil
	}
	if cfg.MetricsClientCA != "" && !cfg.MetricsPlaintext {
		pem, err := os.ReadFile(cfg.MetricsClientCA)
		if err != nil {
			return nil, fmt.Errorf("--metrics-client-ca: %w", err)
		}
		if err := n.metricsGate.SetCA(pem); err != nil {
			return nil, fmt.Errorf("--metrics-client-ca %s: %w", cfg.MetricsClientCA, err)
		}
	}
	l, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	srv := &http.Server{Handler: server.MetricsHandler(n.metricsCollector()), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(tlsErrorLog{n.log}, "", 0)}
	if cfg.MetricsPlaintext {
		n.log.Warn("serving /metrics over plain HTTP WITHOUT AUTHENTICATION (--metrics-plaintext): use only in labs", "address", cfg.MetricsListen)
		return &metricsService{l: l, log: n.log, srv: srv}, nil
	}
	kp, err := metricsauth.ServingCert(n.name.get(), servingNames(n.name.get()), servingIPs(), 0)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("metrics serving certificate: %w", err)
	}
	l = tls.NewListener(l, n.metricsGate.ServerTLS(kp.TLSCertificate()))
	if !n.metricsGate.Armed() {
		n.log.Info("/metrics refuses every scrape until the join brings the cluster CA (labs: --metrics-client-ca)", "address", cfg.MetricsListen)
	}
	return &metricsService{l: l, log: n.log, srv: srv, tls: true}, nil
}

// metricsCollector is what /metrics reads.
func (n *node) metricsCollector() *server.Collector {
	return &server.Collector{Monitor: n.mon, CurrentHostname: facts.Hostname, Version: buildinfo.String(), Holders: n.pods.Holders,
		Rack: func() map[string]int {
			if r := n.rack.Load(); r != nil {
				return r.counts()
			}
			return nil
		},
		CertificateNotAfter: func() time.Time {
			if c := n.creds.Load(); c != nil {
				return c.Current().NotAfter
			}
			return time.Time{}
		},
		Also: []prometheus.Collector{&n.logs}}
}

// armMetricsGate lets the bundle's cluster CA's scrapers in, unless --metrics-client-ca
// named the CA at start.
func (n *node) armMetricsGate(bundle *bootv1.JoinBundle) {
	if n.cfg.MetricsClientCA != "" || n.cfg.MetricsPlaintext || bundle.GetClusterCaPem() == "" {
		return
	}
	if err := n.metricsGate.SetCA([]byte(bundle.GetClusterCaPem())); err != nil {
		n.log.Error("/metrics keeps refusing every scrape: the JoinBundle's cluster CA is unusable", "error", err)
		return
	}
	n.log.Info("/metrics answers the cluster CA's monitoring certificate now", "allowed_cn", strings.Join(metricsCNs(n.cfg.MetricsClientCNs), ","))
}

func metricsCNs(cns []string) []string {
	if len(cns) == 0 {
		return []string{metricsauth.MonitoringCN}
	}
	return cns
}

// servingNames are the DNS names of a metrics serving certificate.
func servingNames(nodeName string) []string {
	out := []string{"localhost"}
	for _, s := range []string{nodeName, facts.Hostname()} {
		if s != "" && !strings.ContainsAny(s, " /") && !containsString(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// servingIPs are its IP addresses: loopback and the machine's global addresses.
func servingIPs() []net.IP {
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, s := range hostIPs() {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		}
	}
	return ips
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// tlsErrorLog puts net/http's server errors (a refused client certificate's
// handshake, with Verify's reason) in the agent's log.
type tlsErrorLog struct{ log *slog.Logger }

func (w tlsErrorLog) Write(p []byte) (int, error) {
	w.log.Warn("metrics: "+strings.TrimSpace(string(p)), "see", "docs/monitoring.md, scrape credentials")
	return len(p), nil
}

// nodeExporterService writes node_exporter's files with the cluster CA and a fresh
// serving certificate, and restarts node-exporter.service so that it loads them
// (decision 0693). node_exporter itself runs under systemd: a restart of the agent
// restarts it with the agent's new serving certificate.
type nodeExporterService struct {
	statusCell
	host   nodeexporter.Restarter
	dir    string
	files  nodeexporter.Files
	name   string
	listen string
}

func (n *node) nodeExporter(bundle *bootv1.JoinBundle) *nodeExporterService {
	var host kubejoin.Host = kubejoin.SystemdHost{}
	if n.cfg.Host != nil {
		host = n.cfg.Host
	}
	dir := n.cfg.NodeExporterDir
	if dir == "" {
		dir = nodeexporter.DefaultDir
	}
	listen := n.cfg.NodeExporterListen
	if listen == "" {
		listen = nodeexporter.DefaultListen
	}
	return &nodeExporterService{host: restarterOf(host), dir: dir, name: bundle.GetNodeName(), listen: listen,
		files: nodeexporter.Files{ClusterCAPEM: []byte(bundle.GetClusterCaPem()), Listen: listen,
			AllowedSANs: []string{metricsauth.MonitoringSAN}}}
}

func (s *nodeExporterService) Name() string { return "node-exporter" }

func (s *nodeExporterService) attempt(ctx context.Context, _ gated) error {
	kp, err := metricsauth.ServingCert(s.name, servingNames(s.name), servingIPs(), 0)
	if err != nil {
		return err
	}
	f := s.files
	f.Serving = kp
	if err := nodeexporter.Write(s.dir, f); err != nil {
		return err
	}
	if err := nodeexporter.Start(ctx, s.host); err != nil {
		return err
	}
	s.set(Running, nodeexporter.Unit+" started on "+s.listen+" (TLS; client certificates of the cluster CA with SAN "+metricsauth.MonitoringSAN+")")
	<-ctx.Done()
	return nil
}

// restarterOf is h's RestartUnit, or its StartUnit when it has none (a test's host).
func restarterOf(h kubejoin.Host) nodeexporter.Restarter {
	if r, ok := h.(nodeexporter.Restarter); ok {
		return r
	}
	return startOnly{h}
}

type startOnly struct{ h kubejoin.Host }

func (s startOnly) RestartUnit(ctx context.Context, unit string) error {
	return s.h.StartUnit(ctx, unit)
}

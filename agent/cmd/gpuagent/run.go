package main

import (
	"context"
	"errors"
	"log/slog"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpurack/gpurack/agent/cdi"
	"github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/agent/node"
	"github.com/gpurack/gpurack/agent/nodeexporter"
	"github.com/gpurack/gpurack/agent/xid"
	"github.com/gpurack/gpurack/internal/memtrim"
)

var timeNow = time.Now

type runFlags struct {
	backendFlags
	listen        string
	metricsListen string
	// metricsClientCA, metricsClientCN and metricsPlaintext are the scrape credential
	// (decision 0693); nodeExporterListen is node_exporter's address ("off": none).
	metricsClientCA    string
	metricsClientCN    string
	metricsPlaintext   bool
	nodeExporterListen string
	socket             string
	insecure           bool
	joinBundle         string
	keyDir             string
	interval           time.Duration
	clearAfter         time.Duration
	kmsg               string
	nodeName           string
	enroll             string
	enrollCA           string
	gossip             node.GossipConfig
	factsRoot          string
	kubeletDir         string
	apiLB              string
	devicePlugin       bool
	cdiDir             string
	cgroupRoot         string
	console            string
	trimAfter          time.Duration

	// insecureRemote lets --insecure listen beyond loopback.
	insecureRemote bool
	// logs configure log shipping (logs.go).
	logs logFlags
}

func newRunCommand() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: continuous checks, XID watch, gRPC API, metrics, gossip",
		Long: `run is the daemon systemd starts (agent/systemd/gpuagent.service, Type=notify). It checks
the GPUs every --interval and at once on every XID, serves gpurack.agent.v1.AgentService
(with grpc.health.v1 and reflection) on the local socket and, with a certificate from
--join-bundle (or plaintext with --insecure), on --listen; /metrics on --metrics-listen
(TLS: only a client certificate of the cluster CA with CN gpurack:monitoring may scrape,
so every scrape is refused until the join brings the CA, or --metrics-client-ca names
it); and gossips health with its rack when the JoinBundle carries gossip settings.

With gpurack.enroll=HOST:PORT and gpurack.enroll.ca=sha256:HEX on /proc/cmdline (or
--enroll and --enroll-ca) it enrolls with gpuboot: Register with its key from --key-dir,
"waiting for approval" until an operator approves, GetJoinBundle, then the Kubernetes
join (kubelet files and kubelet.service over D-Bus; the agent itself on the simulator),
the commissioning report and heartbeats. Once kubelet has joined, it also writes
node_exporter's TLS web configuration under /run/gpurack/node-exporter and starts
node-exporter.service (--node-exporter-listen).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), &f) },
	}
	fs := cmd.Flags()
	f.register(fs)
	fs.StringVar(&f.listen, "listen", ":50051", "gRPC TCP address (mutual TLS with the JoinBundle's certificate; plaintext only with --insecure); empty: none")
	fs.StringVar(&f.metricsListen, "metrics-listen", ":9410", "Prometheus /metrics address; empty: none")
	fs.StringVar(&f.metricsClientCA, "metrics-client-ca", "", "PEM file of the CA a scraper's client certificate must chain to (the cluster CA, pki/ca.crt); default: the JoinBundle's cluster CA, and /metrics refuses every scrape until the agent has one")
	fs.StringVar(&f.metricsClientCN, "metrics-client-cn", metricsauth.MonitoringCN, "comma-separated CommonNames whose client certificates may scrape /metrics")
	fs.BoolVar(&f.metricsPlaintext, "metrics-plaintext", false, "serve /metrics over plain HTTP with no authentication: whoever reaches --metrics-listen reads it (labs only)")
	fs.StringVar(&f.nodeExporterListen, "node-exporter-listen", nodeexporter.DefaultListen, "node_exporter's address (HOST:PORT or :PORT), started with the scrape credential once kubelet has joined; off: not started")
	fs.StringVar(&f.socket, "socket", "/run/gpurack/agent.sock", "local gRPC unix socket (root only); empty: none")
	fs.BoolVar(&f.insecure, "insecure", false, "serve gRPC on --listen without TLS or authentication (labs only; a loopback --listen unless --insecure-unauthenticated-remote)")
	fs.BoolVar(&f.insecureRemote, "insecure-unauthenticated-remote", false, "let --insecure listen on an address other machines reach: whoever reaches it may inject faults and run checks, with no credentials")
	fs.StringVar(&f.joinBundle, "join-bundle", "", "protojson JoinBundle file: node name, agent certificate, gossip settings")
	fs.StringVar(&f.keyDir, "key-dir", joinbundle.DefaultKeyDir, "directory of the agent's enrollment key")
	fs.StringVar(&f.console, "console", "", "also write enrollment progress (\"waiting for approval\" and the key to approve) to this terminal, for whoever watches the machine's screen or serial console; the unit sets /dev/console")
	fs.DurationVar(&f.interval, "interval", 10*time.Second, "time between continuous checklist runs")
	fs.DurationVar(&f.clearAfter, "clear-after", 30*time.Second, "how long checks must stay better before health clears (hysteresis; the only one: gpuboot mirrors GPUHealthy)")
	fs.StringVar(&f.kmsg, "kmsg", "auto", "kernel log for NVRM Xid lines: a path, off, or auto (/dev/kmsg with the nvml backend)")
	fs.StringVar(&f.nodeName, "node-name", "", "node name when there is no JoinBundle (default: none)")
	fs.StringVar(&f.enroll, "enroll", "", "gpuboot enrollment endpoint host:port (overrides gpurack.enroll on /proc/cmdline)")
	fs.StringVar(&f.enrollCA, "enroll-ca", "", "gpuboot CA pin sha256:HEX (overrides gpurack.enroll.ca)")
	fs.StringVar(&f.factsRoot, "facts-root", "/", "root the agent reads /proc/cmdline, /sys/class/dmi/id and os-release under (tests)")
	fs.StringVar(&f.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "kubelet's directory: bootstrap-kubeconfig and config.yaml are written, kubeconfig is read")
	fs.StringVar(&f.apiLB, "api-lb", "127.0.0.1:7445", "where the node's load balancer over the cluster's API servers listens (gpuagent apilb, started as gpurack-apilb.service before kubelet, which then talks to the API through it); empty: kubelet talks to the JoinBundle's API server directly")
	fs.BoolVar(&f.devicePlugin, "device-plugin", false, "serve the nvidia.com/gpu device plugin to the kubelet of --kubelet-dir from the start: for a node whose kubelet this agent does not start (an existing node, or the simulator beside a real kubelet); a node that joins through gpuboot starts it after kubelet without this flag")
	fs.StringVar(&f.cdiDir, "cdi-dir", cdi.Dir, "where the device plugin writes the CDI spec containerd reads")
	fs.StringVar(&f.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup mount used to detect kubelet's cgroup driver")
	fs.DurationVar(&f.trimAfter, "trim-after", time.Minute, "this long after the start, give back the pages of the agent's own binary that starting touched (madvise MADV_PAGEOUT; those still used come back as they are used); 0: never")
	_ = fs.MarkHidden("facts-root")
	registerGossipFlags(fs, &f.gossip)
	registerLogFlags(fs, &f.logs)
	return cmd
}

func registerGossipFlags(fs *pflag.FlagSet, g *node.GossipConfig) {
	fs.StringVar(&g.Bind, "gossip-bind", ":7946", "memberlist address (TCP and UDP)")
	fs.StringVar(&g.Advertise, "gossip-advertise", "", "address peers reach this member at (default: the bind address)")
	fs.StringArrayVar(&g.Seeds, "gossip-seed", nil, "gossip member to join, host:port, repeatable (added to the JoinBundle's seeds)")
	fs.StringVar(&g.KeyFile, "gossip-key-file", "", "rack gossip key as hex in a file, for agents without a JoinBundle")
	fs.StringVar(&g.Rack, "rack", "", "rack name when there is no JoinBundle")
	fs.BoolVar(&g.Local, "gossip-local", false, "memberlist loopback timings (fast failure detection; tests and labs)")
}

// run turns the flags into a node.Config and runs the node until SIGINT or SIGTERM.
// Every error is a configuration the operator must fix: exit 2.
func run(ctx context.Context, f *runFlags) error {
	log, p, b, s, err := f.open()
	if err != nil {
		return err
	}
	defer b.Close() // after node.Run: its NVML event watch has returned
	cfg := node.Config{Backend: b, Sim: s, Profile: p, Log: log, BundleFile: f.joinBundle, Compute: computeHook(""),
		Listen: f.listen, MetricsListen: f.metricsListen, Socket: f.socket, Insecure: f.insecure, InsecureRemote: f.insecureRemote, KeyDir: f.keyDir,
		Interval: f.interval, ClearAfter: f.clearAfter, NodeName: f.nodeName, FactsRoot: facts.Root(f.factsRoot),
		KubeletDir: f.kubeletDir, APILB: f.apiLB, CgroupRoot: f.cgroupRoot, Console: f.console, Gossip: f.gossip,
		DevicePluginDir: filepath.Join(f.kubeletDir, "device-plugins"), DevicePlugin: f.devicePlugin, CDIDir: f.cdiDir,
		StartupXIDs: injectedXIDs(f.faults), MetricsClientCA: f.metricsClientCA, MetricsClientCNs: metricsauth.ParseCNs(f.metricsClientCN),
		MetricsPlaintext: f.metricsPlaintext, NodeExporterListen: f.nodeExporterListen}
	if cfg.Logs, err = f.logs.config(); err != nil {
		return &exitError{2, err}
	}
	if f.metricsPlaintext && f.metricsClientCA != "" {
		return &exitError{2, errors.New("--metrics-plaintext and --metrics-client-ca both given: plain HTTP checks no client certificate; drop one")}
	}
	if len(cfg.MetricsClientCNs) == 0 && !f.metricsPlaintext {
		return &exitError{2, errors.New("--metrics-client-cn is empty: no one could scrape /metrics; give at least one CommonName (default gpurack:monitoring)")}
	}
	if f.joinBundle != "" {
		if cfg.Bundle, err = joinbundle.Load(f.joinBundle, time.Now()); err != nil {
			return &exitError{2, err}
		}
		if cfg.Credentials, err = joinbundle.LoadCredentials(cfg.Bundle, f.keyDir); err != nil {
			return &exitError{2, err}
		}
	}
	target, enrolling, err := enroll.Resolve(cfg.FactsRoot.Cmdline(), f.enroll, f.enrollCA)
	if err != nil {
		return &exitError{2, err}
	}
	switch {
	case enrolling && cfg.Bundle != nil:
		log.Warn("--join-bundle given: not enrolling with gpuboot", "endpoint", target.Endpoint)
	case enrolling:
		cfg.Enroll = &target
	}
	switch f.kmsg {
	case "auto":
		if !b.Simulated() {
			cfg.KmsgPath = xid.KmsgPath
		}
	case "off":
	default:
		cfg.KmsgPath = f.kmsg
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if f.trimAfter > 0 {
		go trimStartupPages(ctx, f.trimAfter, log)
	}
	if err := node.Run(ctx, cfg); err != nil {
		return &exitError{2, err}
	}
	return nil
}

// trimStartupPages waits after, then gives back the binary's file pages that starting
// the agent touched (internal/memtrim): about 60 MiB of gpuagent's resident set before
// it, a few MiB after. A kernel without MADV_PAGEOUT (before 5.4) costs a warning.
func trimStartupPages(ctx context.Context, after time.Duration, log *slog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	r, err := memtrim.Trim()
	if err != nil {
		log.Warn("could not give back the start-up pages of the agent's binary", "error", err)
		return
	}
	log.Info("gave back the start-up pages of the agent's binary", "mappings", r.Mappings,
		"resident_file_kib_before", r.RssFileKiB, "resident_file_kib_after", r.AfterKiB)
}

// Package node is the agent's life on a node: it runs the node's services (the check
// loop, the gRPC API on the local socket and over mutual TLS, metrics, gossip, the
// systemd watchdog) behind one small interface, Service, and takes the node through
// enrollment with gpuboot, the Kubernetes join and commissioning (CONTRACTS §2, §5,
// §6). The node's state is a transition table (lifecycle.go): the enrollment and join
// code reports events and never sets a state itself. The Kubernetes node services
// (kube-proxy, the pod network, NetworkPolicy enforcement, the device plugin) are a
// declared list (postJoinServices) that one supervisor starts once kubelet has joined,
// restarts by each one's policy (agent/retry) and reports.
//
// It is not the command line: agent/cmd/gpuagent parses flags, loads the profile and
// the JoinBundle, opens the GPU backend and hands a Config to Run. Health decisions are
// agent/monitor's and agent/health's; the API is agent/server's.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/logship"
	"github.com/gpurack/gpurack/agent/metricsauth"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/agent/server"
	"github.com/gpurack/gpurack/agent/xid"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/buildinfo"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/profile"
)

// Config is what the node runs with; agent/cmd/gpuagent fills it from its flags.
type Config struct {
	// Backend reads the GPUs; the caller closes it after Run returned (by then the
	// NVML event watch has stopped).
	Backend gpu.Backend
	// Sim is the simulator behind Backend, or nil on real GPUs.
	Sim     *sim.Sim
	Profile *profile.Profile
	Log     *slog.Logger
	// Compute runs the opt-in compute check at commissioning (monitor.Config.Compute);
	// nil: never.
	Compute func(*gpu.Snapshot) *gpucompute.Report

	// Bundle, when not nil, is the JoinBundle given at start (--join-bundle, read from
	// BundleFile) with its Credentials; the node then does not enroll.
	Bundle      *bootv1.JoinBundle
	BundleFile  string
	Credentials *joinbundle.Credentials
	// Enroll, when not nil, is the gpuboot the node enrolls with.
	Enroll *enroll.Target

	// Listen is the gRPC TCP address (mutual TLS with the bundle's certificate, or
	// plaintext with Insecure); MetricsListen the /metrics address; Socket the local
	// unix socket. Empty: none.
	Listen, MetricsListen, Socket string
	// Insecure serves plaintext gRPC on Listen, with no authentication; only on a
	// loopback address unless InsecureRemote accepts that anyone who reaches the
	// address drives the agent (--insecure-unauthenticated-remote).
	Insecure, InsecureRemote bool
	// KeyDir holds the enrollment key, the kept JoinBundle and node credentials.
	KeyDir string
	// Interval between checklists; ClearAfter the health hysteresis (the only one:
	// decision 0205).
	Interval, ClearAfter time.Duration
	// KmsgPath is the kernel log to watch for XIDs; empty: none.
	KmsgPath string
	// StartupXIDs happened before the agent started (the simulator's --fault xid); they
	// enter the XID history before the first checklist, so commissioning sees them.
	StartupXIDs []xid.Event
	// NodeName when there is no JoinBundle; default: the hostname.
	NodeName string
	// FactsRoot is where identity and the kernel command line are read.
	FactsRoot facts.Root
	// KubeletDir and CgroupRoot are for the real-node join.
	KubeletDir, CgroupRoot string
	// APILB is where the node's API load balancer listens (127.0.0.1:7445), started
	// before kubelet on a real-node join as the transient unit gpurack-apilb.service
	// over the JoinBundle's api_servers; kubelet and the node's services reach the API
	// through it (docs/ha.md). Empty: kubelet talks to the bundle's API server directly.
	APILB string
	// DevicePluginDir is kubelet's device-plugins directory, where the device plugin
	// serves once kubelet runs; empty: /var/lib/kubelet/device-plugins/.
	DevicePluginDir string
	// DevicePlugin serves the device plugin from the start, to a kubelet the agent
	// does not start (an existing node, or the simulator beside a real kubelet);
	// otherwise a node that joins starts it once its kubelet runs, and a simulated
	// node without a kubelet never does.
	DevicePlugin bool
	// CDIDir is where the device plugin writes the CDI spec; empty: /var/run/cdi.
	// SimDevDir is where the simulator's device nodes are made; empty:
	// /run/gpurack/sim-dev (agent/cdi).
	CDIDir, SimDevDir string
	// CNIBinDir and CNIConfDir are containerd's CNI plugin and configuration
	// directories, for the pod network; empty: the image's (agent/podnet).
	CNIBinDir, CNIConfDir string
	// MetricsClientCA is a PEM file of the CA a scraper's client certificate must chain
	// to (--metrics-client-ca); empty: the JoinBundle's cluster CA, and until the agent
	// has one every scrape is refused. MetricsClientCNs are the CommonNames that may
	// scrape; empty: gpurack:monitoring. MetricsPlaintext serves /metrics over plain
	// HTTP with no authentication instead (labs; decision 0693).
	MetricsClientCA  string
	MetricsClientCNs []string
	MetricsPlaintext bool
	// NodeExporterListen is node_exporter's address, which the agent starts once
	// kubelet has joined; empty: nodeexporter.DefaultListen (:9100); "off": not
	// started. NodeExporterDir is where its files go; empty: nodeexporter.DefaultDir.
	NodeExporterListen, NodeExporterDir string
	// RegistryHostsDir is containerd's registry config_path, where the agent writes the
	// cluster registry's hosts.toml (agent/registryhosts); empty: registryhosts.DefaultDir.
	RegistryHostsDir string
	// Console, when set, also gets enrollment progress (the machine's console).
	Console string
	Gossip  GossipConfig
	// Host starts kubelet on real nodes; nil: systemd over D-Bus.
	Host kubejoin.Host
	// Logs is how the node ships its journal and container logs once it has joined
	// (logs.go); where to comes in the JoinBundle.
	Logs LogShipping
}

// Run runs the node until ctx ends, then stops every service and returns nil. An error
// means it could not start (a listener, gossip): the configuration needs fixing.
func Run(ctx context.Context, cfg Config) error {
	n, err := newNode(ctx, cfg)
	if err != nil {
		return err
	}
	// READY=1 before enrolling (CONTRACTS §6): the unit is active with or without
	// gpurack.enroll.
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=checking GPUs ("+cfg.Backend.Name()+")"); err != nil {
		n.log.Warn("sd_notify READY failed", "error", err)
	} else if ok {
		n.log.Info("notified systemd: READY")
	}
	n.log.Info("gpuagent running", "version", buildinfo.String(), "backend", cfg.Backend.Name(), "profile", cfg.Profile.Name, "node", n.name.get())

	<-ctx.Done()
	n.log.Info("stopping")
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	n.services.Wait()
	for _, st := range n.services.Statuses() {
		if st.State == Failed {
			n.log.Warn("node service had failed", "service", st.Name, "error", st.Message)
		}
	}
	return nil
}

// node is one running agent.
type node struct {
	cfg        Config
	log        *slog.Logger
	mon        *monitor.Monitor
	api        *server.Service
	services   *Services
	rack       atomic.Pointer[rackGossip]
	name       nodeName
	enrollment *enrollState
	identity   facts.Identity
	imageID    string
	started    time.Time
	// logs counts what log shipping did, for /metrics (its zero value is ready).
	logs logship.Metrics
	// revoked is gpuboot's certificate revocation list as the last heartbeat answer
	// brought it, kept in the key directory; the mutual-TLS API refuses what is on it.
	revoked *pki.RevocationList
	// guard authorises every call on the mutual-TLS API against revoked and the
	// operator levels; useRevocations has it end the streams a new list revokes.
	guard *server.Guard
	// pods says which containers hold the GPUs (kubelet's pod-resources API), for the
	// metrics and the heartbeat; tenants names their namespaces' tenants.
	pods    *podres.Cache
	tenants *podres.Tenants
	// disks is what the data-disk service found, for the heartbeats and Status, and
	// the wipe requests gpuboot's answers bring it.
	disks *diskReport
	// creds are the agent certificate and key once a JoinBundle brought them (renewal
	// replaces the certificate inside), for the metrics.
	creds atomic.Pointer[joinbundle.Credentials]
	// metricsGate decides who may scrape /metrics (agent/metricsauth); the join arms it
	// with the cluster CA unless --metrics-client-ca did at start.
	metricsGate *metricsauth.Gate
}

// newNode builds the monitor and the API and starts the services the configuration
// asks for at start.
func newNode(ctx context.Context, cfg Config) (*node, error) {
	if cfg.Insecure && cfg.Credentials != nil {
		return nil, errors.New("--insecure and --join-bundle both given: the bundle's certificate would go unused")
	}
	log := cfg.Log
	n := &node{cfg: cfg, log: log, services: NewServices(ctx, log), started: time.Now(),
		identity: cfg.FactsRoot.ReadIdentity(), imageID: cfg.FactsRoot.ImageID(), disks: newDiskReport()}
	n.metricsGate = &metricsauth.Gate{CNs: cfg.MetricsClientCNs}
	n.revoked = loadRevocations(cfg.KeyDir, log)
	n.guard = server.NewGuard(n.revoked)
	n.pods = &podres.Cache{Socket: podres.Socket(cfg.KubeletDir)}
	n.tenants = &podres.Tenants{Kubeconfig: kubeletPaths(cfg.KubeletDir).Kubeconfig}
	n.name.set(cfg.NodeName)
	if cfg.Bundle != nil {
		n.name.set(cfg.Bundle.GetNodeName())
	}
	if n.name.get() == "" {
		n.name.set(facts.Hostname())
	}
	n.mon = monitor.New(monitor.Config{Backend: cfg.Backend, Profile: cfg.Profile, Log: log, Interval: cfg.Interval,
		ClearAfter: cfg.ClearAfter, KmsgPath: cfg.KmsgPath, Peers: func() []checks.Peer { return n.rack.Load().peers() },
		Compute: cfg.Compute})
	for _, e := range cfg.StartupXIDs {
		n.mon.RecordXID(e, 0)
	}
	n.api = &server.Service{Monitor: n.mon, Identity: n.identity, ImageID: n.imageID, Version: buildinfo.String(),
		StartedAt: n.started, NodeName: n.name.get, DataDisks: n.disks.snapshot,
		Rack: func() *agentv1.RackView {
			if r := n.rack.Load(); r != nil {
				return r.view()
			}
			return nil
		}}
	if cfg.Sim != nil {
		n.api.Faults = cfg.Sim
	}
	n.enrollment = &enrollState{st: initialEnrollment(cfg, n.started)}
	n.api.Enrollment = n.enrollment.get

	start, err := n.configuredServices()
	if err != nil {
		return nil, err
	}
	for _, s := range start {
		n.services.Start(s)
	}
	return n, nil
}

// configuredServices sets up the services the configuration asks for at start, not
// started yet. Everything that can fail on bad configuration comes first, so that
// nothing runs when it returns an error; what it opened before then it closes.
func (n *node) configuredServices() ([]Service, error) {
	cfg := n.cfg
	var start []Service
	fail := func(err error) ([]Service, error) {
		for _, s := range start {
			if c, ok := s.(interface{ close() }); ok {
				c.close()
			}
		}
		return nil, err
	}
	if cfg.Bundle != nil {
		svcs, err := n.bundleServices(cfg.Bundle, cfg.Credentials)
		if err != nil {
			return fail(err)
		}
		start = append(start, svcs...)
	} else if g, err := startGossip(cfg.Gossip, nil, n.name.get(), n.imageID, n.mon, n.log); err != nil {
		return fail(err)
	} else if g != nil {
		n.rack.Store(g.rack)
		start = append(start, g)
	}
	for _, listener := range []func() (Service, error){n.socketListener, n.tcpListener, n.metricsListener} {
		s, err := listener()
		if err != nil {
			return fail(err)
		}
		if s != nil {
			start = append(start, s)
		}
	}
	start = append(start, &checksService{mon: n.mon, interval: cfg.Interval},
		&watchdogService{mon: n.mon, interval: cfg.Interval, log: n.log})
	if cfg.Bundle != nil || cfg.Enroll != nil {
		start = append(start, &joinService{n: n})
	}
	if cfg.DevicePlugin {
		start = append(start, n.devicePlugin())
	}
	return start, nil
}

// socketListener serves the API on the local unix socket (Config.Socket); nil: none.
func (n *node) socketListener() (Service, error) {
	if n.cfg.Socket == "" {
		return nil, nil
	}
	l, err := listenUnix(n.cfg.Socket)
	if err != nil {
		return nil, err
	}
	if w := openDirWarning(n.cfg.Socket); w != "" {
		n.log.Warn(w)
	}
	gs, _ := server.NewGRPC(n.api, nil, nil)
	return &grpcService{name: "grpc-unix", l: l, gs: gs, log: n.log, socket: n.cfg.Socket}, nil
}

// tcpListener serves the API in plaintext on Config.Listen (--insecure); nil when
// there is none at start (mutual TLS comes with the JoinBundle's certificate).
func (n *node) tcpListener() (Service, error) {
	cfg := n.cfg
	switch {
	case cfg.Listen == "" || cfg.Credentials != nil:
	case cfg.Insecure:
		if err := insecureAddressAllowed(cfg.Listen, cfg.InsecureRemote); err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("--listen: %w", err)
		}
		n.log.Warn("serving gRPC WITHOUT TLS OR AUTHENTICATION (--insecure): whoever reaches the address may inject faults and run checks; use only in labs", "address", cfg.Listen)
		gs, _ := server.NewGRPC(n.api, nil, nil)
		return &grpcService{name: "grpc-tcp-plaintext", l: l, gs: gs, log: n.log}, nil
	case cfg.Enroll != nil:
		n.log.Info("no TCP gRPC until enrollment brings the agent certificate; the local socket serves", "socket", cfg.Socket)
	default:
		n.log.Info("no TCP gRPC: no certificate yet (pass --join-bundle or --enroll, or --insecure in labs); the local socket serves", "socket", cfg.Socket)
	}
	return nil, nil
}

// insecureAddressAllowed refuses plaintext gRPC (--insecure) on an address other
// machines can reach (all addresses, a routable IP, a host name other than localhost)
// unless remote says the operator accepts it.
func insecureAddressAllowed(listen string, remote bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() || remote {
		return nil
	}
	return fmt.Errorf("--insecure on --listen %q: plaintext gRPC with no authentication would be reachable from other machines, and whoever reaches it may inject faults and run checks; "+
		"listen on 127.0.0.1:PORT or [::1]:PORT, use mutual TLS (--join-bundle or --enroll), or pass --insecure-unauthenticated-remote to accept that", listen)
}

// bundleServices sets up what a JoinBundle enables: gossip with its rack key and the
// mutual-TLS listener with its certificate. The services are not started yet.
func (n *node) bundleServices(bundle *bootv1.JoinBundle, creds *joinbundle.Credentials) ([]Service, error) {
	n.name.set(bundle.GetNodeName())
	if creds != nil {
		n.creds.Store(creds)
	}
	n.armMetricsGate(bundle)
	var out []Service
	g, err := startGossip(n.cfg.Gossip, bundle, bundle.GetNodeName(), n.imageID, n.mon, n.log)
	if err != nil {
		return nil, err
	}
	if g != nil {
		n.rack.Store(g.rack)
		out = append(out, g)
	}
	if n.cfg.Listen != "" && creds != nil && !n.cfg.Insecure {
		l, err := net.Listen("tcp", n.cfg.Listen)
		if err != nil {
			if g != nil {
				g.close()
			}
			return nil, fmt.Errorf("--listen: %w", err)
		}
		gs, _ := server.NewGRPC(n.api, creds.ServerTLS(n.revoked), n.guard)
		out = append(out, &grpcService{name: "grpc-tcp-mtls", l: l, gs: gs, log: n.log})
	}
	return out, nil
}

// withBundle starts what a JoinBundle that enrollment fetched enables.
func (n *node) withBundle(bundle *bootv1.JoinBundle, creds *joinbundle.Credentials) error {
	svcs, err := n.bundleServices(bundle, creds)
	if err != nil {
		return err
	}
	for _, s := range svcs {
		n.services.Start(s)
	}
	return nil
}

// initialEnrollment is the enrollment state at start.
func initialEnrollment(cfg Config, since time.Time) *agentv1.EnrollmentStatus {
	st := &agentv1.EnrollmentStatus{Since: timestamppb.New(since)}
	switch {
	case cfg.Bundle != nil:
		st.State = joining
		st.Message = "JoinBundle loaded from " + cfg.BundleFile
	case cfg.Enroll != nil:
		st.State = registering
		st.Endpoint = cfg.Enroll.Endpoint
		st.Message = "registering with gpuboot at " + cfg.Enroll.Endpoint
	default:
		st.State = notEnrolling
		st.Message = "no gpurack.enroll on the kernel command line and no --enroll: serving the API and checks only"
	}
	return st
}

// nodeName is the node name, set again when enrollment brings a JoinBundle.
type nodeName struct{ v atomic.Value }

func (n *nodeName) set(s string) {
	if s != "" {
		n.v.Store(s)
	}
}

func (n *nodeName) get() string {
	s, _ := n.v.Load().(string)
	return s
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/server"
	"github.com/gpurack/gpurack/agent/xid"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/buildinfo"
)

var timeNow = time.Now

type runFlags struct {
	backendFlags
	listen        string
	metricsListen string
	socket        string
	insecure      bool
	joinBundle    string
	keyDir        string
	interval      time.Duration
	clearAfter    time.Duration
	kmsg          string
	nodeName      string
	enroll        string
	enrollCA      string
	gossip        gossipFlags
	factsRoot     string
	kubeletDir    string
	cgroupRoot    string
	console       string
}

func newRunCommand() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: continuous checks, XID watch, gRPC API, metrics, gossip",
		Long: `run is the daemon systemd starts (agent/systemd/gpuagent.service, Type=notify). It checks
the GPUs every --interval and at once on every XID, serves gpurack.agent.v1.AgentService
(with grpc.health.v1 and reflection) on the local socket and, with a certificate from
--join-bundle (or plaintext with --insecure), on --listen; /metrics on --metrics-listen;
and gossips health with its rack when the JoinBundle carries gossip settings.

With gpurack.enroll=HOST:PORT and gpurack.enroll.ca=sha256:HEX on /proc/cmdline (or
--enroll and --enroll-ca) it enrolls with gpuboot: Register with its key from --key-dir,
"waiting for approval" until an operator approves, GetJoinBundle, then the Kubernetes
join (kubelet files and kubelet.service over D-Bus; the agent itself on the simulator),
the commissioning report and heartbeats.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), &f) },
	}
	fs := cmd.Flags()
	f.register(fs)
	fs.StringVar(&f.listen, "listen", ":50051", "gRPC TCP address (mutual TLS with the JoinBundle's certificate; plaintext only with --insecure); empty: none")
	fs.StringVar(&f.metricsListen, "metrics-listen", ":9410", "Prometheus /metrics address; empty: none")
	fs.StringVar(&f.socket, "socket", "/run/gpurack/agent.sock", "local gRPC unix socket (root only); empty: none")
	fs.BoolVar(&f.insecure, "insecure", false, "serve gRPC on --listen without TLS (labs only)")
	fs.StringVar(&f.joinBundle, "join-bundle", "", "protojson JoinBundle file: node name, agent certificate, gossip settings")
	fs.StringVar(&f.keyDir, "key-dir", joinbundle.DefaultKeyDir, "directory of the agent's enrollment key")
	fs.StringVar(&f.console, "console", "", "also write enrollment progress (\"waiting for approval\" and the key to approve) to this terminal, for whoever watches the machine's screen or serial console; the unit sets /dev/console")
	fs.DurationVar(&f.interval, "interval", 10*time.Second, "time between continuous checklist runs")
	fs.DurationVar(&f.clearAfter, "clear-after", 30*time.Second, "how long checks must stay better before health clears (hysteresis)")
	fs.StringVar(&f.kmsg, "kmsg", "auto", "kernel log for NVRM Xid lines: a path, off, or auto (/dev/kmsg with the nvml backend)")
	fs.StringVar(&f.nodeName, "node-name", "", "node name when there is no JoinBundle (default: none)")
	fs.StringVar(&f.enroll, "enroll", "", "gpuboot enrollment endpoint host:port (overrides gpurack.enroll on /proc/cmdline)")
	fs.StringVar(&f.enrollCA, "enroll-ca", "", "gpuboot CA pin sha256:HEX (overrides gpurack.enroll.ca)")
	fs.StringVar(&f.factsRoot, "facts-root", "/", "root the agent reads /proc/cmdline, /sys/class/dmi/id and os-release under (tests)")
	fs.StringVar(&f.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "kubelet's directory: bootstrap-kubeconfig and config.yaml are written, kubeconfig is read")
	fs.StringVar(&f.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup mount used to detect kubelet's cgroup driver")
	_ = fs.MarkHidden("facts-root")
	f.gossip.register(fs)
	return cmd
}

func run(ctx context.Context, f *runFlags) error {
	log, err := f.logger()
	if err != nil {
		return &exitError{2, err}
	}
	p, err := f.loadProfile()
	if err != nil {
		return &exitError{2, err}
	}
	b, s, err := f.openBackend(p)
	if err != nil {
		return &exitError{2, err}
	}
	defer b.Close()
	var bundle *bootv1.JoinBundle
	var creds *joinbundle.Credentials
	if f.joinBundle != "" {
		if bundle, err = joinbundle.Load(f.joinBundle, time.Now()); err != nil {
			return &exitError{2, err}
		}
		if creds, err = joinbundle.LoadCredentials(bundle, f.keyDir); err != nil {
			return &exitError{2, err}
		}
	}
	if f.insecure && creds != nil {
		return &exitError{2, errors.New("--insecure and --join-bundle both given: the bundle's certificate would go unused")}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	root := facts.Root(f.factsRoot)
	hostname := facts.Hostname()
	target, enrolling, err := enroll.Resolve(root.Cmdline(), f.enroll, f.enrollCA)
	if err != nil {
		return &exitError{2, err}
	}
	if enrolling && bundle != nil {
		log.Warn("--join-bundle given: not enrolling with gpuboot", "endpoint", target.Endpoint)
		enrolling = false
	}
	node := &nodeNameVar{}
	node.set(f.nodeName)
	if bundle != nil {
		node.set(bundle.GetNodeName())
	}
	if node.get() == "" {
		node.set(hostname)
	}
	kmsg := f.kmsg
	switch kmsg {
	case "auto":
		kmsg = ""
		if !b.Simulated() {
			kmsg = xid.KmsgPath
		}
	case "off":
		kmsg = ""
	}
	started := time.Now()
	var rack atomic.Pointer[rackGossip]
	mon := monitor.New(monitor.Config{Backend: b, Profile: p, Log: log, Interval: f.interval, ClearAfter: f.clearAfter,
		KmsgPath: kmsg, Peers: func() []checks.Peer { return rack.Load().peers() }})
	imageID := root.ImageID()
	svc := &server.Service{Monitor: mon, Identity: root.ReadIdentity(), ImageID: imageID, Version: buildinfo.String(),
		StartedAt: started, NodeName: node.get,
		Rack: func() *agentv1.RackView {
			if r := rack.Load(); r != nil {
				return r.view()
			}
			return nil
		},
		Render: func(x any) (agentv1.EventKind, *agentv1.Event) {
			if r := rack.Load(); r != nil {
				return r.render(x)
			}
			return agentv1.EventKind_EVENT_KIND_UNSPECIFIED, nil
		}}
	if s != nil {
		svc.Faults = s
	}
	enrollment := &enrollState{st: enrollmentStatus(f, target, enrolling, bundle, started)}
	svc.Enrollment = enrollment.get

	var wg sync.WaitGroup
	var srvMu sync.Mutex
	var servers []*grpc.Server
	serve := func(name string, l net.Listener, gs *grpc.Server) {
		srvMu.Lock()
		servers = append(servers, gs)
		srvMu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.Info("serving gRPC", "listener", name, "address", l.Addr().String())
			if err := gs.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				log.Error("gRPC server stopped", "listener", name, "error", err)
			}
		}()
	}
	// withBundle starts what a JoinBundle enables: the mTLS listener with its
	// certificate, and gossip with its rack key. It runs at start (--join-bundle) or
	// once enrollment has fetched the bundle.
	withBundle := func(bundle *bootv1.JoinBundle, creds *joinbundle.Credentials) error {
		node.set(bundle.GetNodeName())
		r, err := startGossip(ctx, f, bundle, bundle.GetNodeName(), imageID, mon, log)
		if err != nil {
			return err
		}
		if r != nil {
			rack.Store(r)
		}
		if f.listen != "" && creds != nil && !f.insecure {
			l, err := net.Listen("tcp", f.listen)
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			gs, _ := server.NewGRPC(svc, creds.ServerTLS())
			serve("tcp+mtls", l, gs)
		}
		return nil
	}
	if bundle != nil {
		if err := withBundle(bundle, creds); err != nil {
			return &exitError{2, err}
		}
	} else if r, err := startGossip(ctx, f, nil, node.get(), imageID, mon, log); err != nil {
		return &exitError{2, err}
	} else if r != nil {
		rack.Store(r)
	}
	defer func() {
		if r := rack.Load(); r != nil {
			r.leave()
		}
	}()

	if f.socket != "" {
		l, err := listenUnix(f.socket)
		if err != nil {
			return &exitError{2, err}
		}
		gs, _ := server.NewGRPC(svc, nil)
		serve("unix", l, gs)
	}
	switch {
	case f.listen == "" || creds != nil:
	case f.insecure:
		l, err := net.Listen("tcp", f.listen)
		if err != nil {
			return &exitError{2, fmt.Errorf("--listen: %w", err)}
		}
		log.Warn("serving gRPC WITHOUT TLS (--insecure); use only in labs")
		gs, _ := server.NewGRPC(svc, nil)
		serve("tcp+plaintext", l, gs)
	case enrolling:
		log.Info("no TCP gRPC until enrollment brings the agent certificate; the local socket serves", "socket", f.socket)
	default:
		log.Info("no TCP gRPC: no certificate yet (pass --join-bundle or --enroll, or --insecure in labs); the local socket serves", "socket", f.socket)
	}
	var httpSrv *http.Server
	if f.metricsListen != "" {
		l, err := net.Listen("tcp", f.metricsListen)
		if err != nil {
			return &exitError{2, fmt.Errorf("--metrics-listen: %w", err)}
		}
		col := &server.Collector{Monitor: mon, Hostname: hostname, Version: buildinfo.String(),
			Rack: func() map[string]int {
				if r := rack.Load(); r != nil {
					return r.counts()
				}
				return nil
			}}
		httpSrv = &http.Server{Handler: server.MetricsHandler(col), ReadHeaderTimeout: 10 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.Info("serving metrics", "address", l.Addr().String())
			if err := httpSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "error", err)
			}
		}()
	}

	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.Run(ctx) }()
	joinDone := make(chan struct{})
	j := &joiner{f: f, simulated: b.Simulated(), sim: s, profile: p, imageID: imageID, mon: mon, enroll: enrollment, log: log,
		root: root, started: started, node: node}
	go func() {
		defer close(joinDone)
		switch {
		case bundle != nil:
			j.join(ctx, bundle, nil)
		case enrolling:
			j.enrollAndJoin(ctx, target, withBundle)
		}
	}()

	// READY=1 before enrolling (CONTRACTS §6): the unit is active with or without
	// gpurack.enroll.
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=checking GPUs ("+b.Name()+")"); err != nil {
		log.Warn("sd_notify READY failed", "error", err)
	} else if ok {
		log.Info("notified systemd: READY")
	}
	wdDone := make(chan struct{})
	go func() { defer close(wdDone); watchdog(ctx, mon, f.interval, log) }()
	log.Info("gpuagent running", "version", buildinfo.String(), "backend", b.Name(), "profile", p.Name, "node", node.get())

	<-ctx.Done()
	log.Info("stopping")
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	srvMu.Lock()
	stopping := append([]*grpc.Server(nil), servers...)
	srvMu.Unlock()
	for _, gs := range stopping {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(3 * time.Second):
			gs.Stop()
		}
	}
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		httpSrv.Shutdown(sctx)
		cancel()
	}
	<-monDone // the NVML event watch has returned: NVML may shut down
	<-joinDone
	<-wdDone
	wg.Wait()
	if f.socket != "" {
		os.Remove(f.socket)
	}
	return nil
}

// watchdog sends WATCHDOG=1 at half systemd's WatchdogSec while the check loop is
// alive (a checklist finished within three intervals), so a hung NVML call gets the
// agent restarted.
func watchdog(ctx context.Context, mon *monitor.Monitor, interval time.Duration, log *slog.Logger) {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil || every == 0 {
		return
	}
	log.Info("systemd watchdog enabled", "timeout", every)
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		last := mon.Last()
		if last == nil || time.Since(last.FinishedAt) < 3*interval+every {
			daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		} else {
			log.Error("check loop stalled; not feeding the watchdog", "last_checklist", last.FinishedAt)
		}
	}
}

// listenUnix listens on a root-only unix socket, replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	return l, nil
}

// enrollmentStatus is the enrollment state at start.
func enrollmentStatus(f *runFlags, target enroll.Target, enrolling bool, bundle *bootv1.JoinBundle, since time.Time) *agentv1.EnrollmentStatus {
	st := &agentv1.EnrollmentStatus{Since: timestamppb.New(since)}
	switch {
	case bundle != nil:
		st.State = agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING
		st.Message = "JoinBundle loaded from " + f.joinBundle
	case enrolling:
		st.State = agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING
		st.Endpoint = target.Endpoint
		st.Message = "registering with gpuboot at " + target.Endpoint
	default:
		st.State = agentv1.EnrollmentState_ENROLLMENT_STATE_NOT_ENROLLING
		st.Message = "no gpurack.enroll on the kernel command line and no --enroll: serving the API and checks only"
	}
	return st
}

// nodeNameVar is the node name, set again when enrollment brings a JoinBundle.
type nodeNameVar struct{ v atomic.Value }

func (n *nodeNameVar) set(s string) {
	if s != "" {
		n.v.Store(s)
	}
}

func (n *nodeNameVar) get() string {
	s, _ := n.v.Load().(string)
	return s
}

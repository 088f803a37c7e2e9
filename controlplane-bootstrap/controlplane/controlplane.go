// Package controlplane is what `controlplane-bootstrap init|status|stop|reset`
// and `certs renew` do: it lays out a cluster directory, creates the PKI and
// configuration files, starts etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler (supervised child processes, or systemd units), waits for
// each to be healthy, and applies the join material, the cluster DNS and the
// node-local volumes' objects; it renews certificates and restarts the
// components that read them (renew.go, restarts.go).
//
// The parts it orders live elsewhere: cluster.yaml in clusterconfig, the
// PKI in clusterpki, flags, units and the supervisor in components, the
// join objects in joinconfig, CoreDNS's objects in clusterdns, and the
// node-local volumes' StorageClass, RBAC and admission policy in localvolumes.
package controlplane

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/localvolumes"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
)

// Mode is how the components run.
type Mode int

const (
	// Foreground runs them as children of this process (--foreground).
	Foreground Mode = iota
	// Systemd runs them as systemd units started over D-Bus.
	Systemd
)

// Options configure Init.
type Options struct {
	// Dir is the cluster directory; created if missing.
	Dir string
	// Config is the parsed cluster.yaml; ConfigYAML its bytes, copied into
	// Dir so later commands need only --dir. Nil Config means: read it back
	// from Dir (a re-run).
	Config     *clusterconfig.Config
	ConfigYAML []byte
	Mode       Mode
	// Out receives progress and the health report; nil discards it.
	Out io.Writer
	// Logf receives the supervisor's events; nil writes them to Out.
	Logf func(format string, args ...any)
	// ReadyTimeout bounds the wait for each component; zero means 3 minutes.
	ReadyTimeout time.Duration
	// WritePIDFile records this process as the supervisor of Dir, for
	// `status` and `stop` (the CLI sets it; test harnesses do not).
	WritePIDFile bool
	// UnitDir is where systemd units go; default /etc/systemd/system.
	UnitDir string
	// Executable is the controlplane-bootstrap program, which runs the log gateway
	// (`controlplane-bootstrap logs-gateway`, monitoring.logs); empty: this process's
	// own executable. A test binary that starts a control plane with logs answers
	// that subcommand itself (testcluster.Main) and is given here.
	Executable string
	// LeafValidity is how long the leaf certificates and kubeconfig credentials that
	// init issues are valid; zero means a year (pki.DefaultLeafValidity). Tests set
	// minutes to see certificates expire; `certs renew --validity` sets it for renewals.
	LeafValidity time.Duration
}

// ControlPlane is a started (or found running) control plane.
type ControlPlane struct {
	Layout components.Layout
	Config *clusterconfig.Config
	PKI    *clusterpki.Set
	// Supervisor runs the components in Foreground mode; nil otherwise, and
	// nil when AlreadyRunning.
	Supervisor *components.Supervisor
	// AlreadyRunning is set when Init found another supervisor of Dir alive
	// and only re-applied the join material.
	AlreadyRunning bool
	// Health is the per-component health at the end of Init.
	Health []components.Health
	// ReadyAfter is the time from the start of Init to all components healthy.
	ReadyAfter time.Duration

	// readyTimeout bounds the wait for each component, at init and on a restart.
	readyTimeout time.Duration
	// restarts serves `certs renew`'s restart requests (Foreground mode, with the PID
	// file); nil otherwise.
	restarts  *restartServer
	restartMu sync.Mutex // one RestartComponents at a time
}

// AdminKubeconfig is the path of the admin kubeconfig (system:masters).
func (cp *ControlPlane) AdminKubeconfig() string {
	return cp.Layout.Kubeconfig(clusterpki.AdminKubeconfig)
}

// Stop stops the supervised components (Foreground mode) and removes the
// supervisor PID file if it is this process's.
func (cp *ControlPlane) Stop() {
	if cp.restarts != nil {
		cp.restarts.close()
	}
	if cp.Supervisor != nil {
		cp.Supervisor.Stop(20 * time.Second)
	}
	if pid, _ := readPIDFile(cp.Layout.SupervisorPIDFile()); pid == os.Getpid() {
		os.Remove(cp.Layout.SupervisorPIDFile())
	}
}

// ComponentError is a component that failed during init, with the end of
// its log.
type ComponentError struct {
	Component string
	Err       error
	LogFile   string
	LogTail   string
}

func (e *ComponentError) Error() string {
	msg := fmt.Sprintf("%s: %v", e.Component, e.Err)
	if e.LogTail != "" {
		msg += "\n  last lines of " + e.LogFile + ":\n    " + strings.ReplaceAll(e.LogTail, "\n", "\n    ")
	}
	return msg
}

func (e *ComponentError) Unwrap() error { return e.Err }

// Init brings the control plane in opts.Dir up. It is safe to run again on
// the same directory: existing PKI and data are kept, and a control plane
// already running there is left running (its join material re-applied).
// Nothing is started before every input has been checked (configuration,
// binaries, ports), and a failure while starting stops what was started.
func Init(ctx context.Context, opts Options) (*ControlPlane, error) {
	began := time.Now()
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	l := components.Layout{Dir: dir}
	cfg, cfgYAML, err := initConfig(opts, l)
	if err != nil {
		return nil, err
	}
	specs := components.Specs(cfg, l)

	if by, running := alreadyRunning(ctx, l); running {
		fmt.Fprintf(out, "control plane in %s is already running (%s); re-applying join material\n", dir, by)
		cp, err := load(l)
		if err != nil {
			return nil, err
		}
		cp.AlreadyRunning = true
		if err := cp.applyKueue(ctx); err != nil {
			return nil, err
		}
		if err := cp.applyJoinMaterial(ctx); err != nil {
			return nil, err
		}
		cp.Health = cp.Probe(ctx)
		return cp, nil
	}

	bins, err := checkInputs(cfg, specs, opts.Mode, opts.Executable)
	if err != nil {
		return nil, err
	}
	amConfig, err := readAlertmanagerConfig(cfg)
	if err != nil {
		return nil, err
	}
	siteRules, err := readSiteRules(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := readKueueManifests(cfg); err != nil {
		return nil, err
	}
	set, err := writeFiles(l, cfg, cfgYAML, opts.LeafValidity)
	if err != nil {
		return nil, err
	}
	if err := writeMonitoringFiles(l, cfg, amConfig, siteRules); err != nil {
		return nil, err
	}
	if err := writeQueueFiles(l, cfg); err != nil {
		return nil, err
	}
	if err := writeRegistryFiles(l, cfg); err != nil {
		return nil, err
	}
	cp := &ControlPlane{Layout: l, Config: cfg, PKI: set, readyTimeout: opts.ReadyTimeout}
	if err := cp.start(ctx, opts, specs, bins, out); err != nil {
		return nil, err
	}
	cp.ReadyAfter = time.Since(began)
	if err := cp.applyJoinMaterial(ctx); err != nil {
		cp.Stop()
		return nil, err
	}
	cp.Health = cp.Probe(ctx)
	return cp, nil
}

// initConfig is the configuration Init runs: opts.Config, or else the cluster.yaml
// already in the directory; and the YAML to write there (nil when it is already
// there).
func initConfig(opts Options, l components.Layout) (*clusterconfig.Config, []byte, error) {
	if opts.Config == nil {
		cfg, err := clusterconfig.Load(l.ConfigFile())
		if err != nil {
			return nil, nil, fmt.Errorf("no --config given and none in %s: %w", l.Dir, err)
		}
		return cfg, nil, nil
	}
	if opts.ConfigYAML != nil {
		return opts.Config, opts.ConfigYAML, nil
	}
	data, err := opts.Config.Marshal()
	if err != nil {
		return nil, nil, err
	}
	return opts.Config, data, nil
}

// checkInputs checks every input before anything is written or started: the
// components' binaries (returned by name; self, or else this process's executable,
// for a component that is controlplane-bootstrap itself), systemd when mode needs it,
// and that the components' ports are free.
func checkInputs(cfg *clusterconfig.Config, specs []components.Component, mode Mode, self string) (map[string]string, error) {
	binDir := components.BinDir(cfg.BinDir)
	bins := map[string]string{}
	for _, c := range specs {
		if c.Self {
			p, err := selfExecutable(self)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.Name, err)
			}
			bins[c.Name] = p
			continue
		}
		p, err := components.FindBinary(binDir, c.Name)
		if err != nil {
			return nil, err
		}
		bins[c.Name] = p
	}
	if mode == Systemd && !components.SystemdBooted() {
		return nil, errors.New("this host's PID 1 is not systemd, so the components cannot run as units: run `init --foreground` to supervise them from this process")
	}
	if err := components.CheckPorts(specs); err != nil {
		return nil, err
	}
	return bins, nil
}

// selfExecutable is self, or this process's executable; the path must be absolute, as
// a systemd unit's ExecStart needs.
func selfExecutable(self string) (string, error) {
	if self == "" {
		p, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find this program's executable, which runs it: %w", err)
		}
		self = p
	}
	abs, err := filepath.Abs(self)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file (components run it as `controlplane-bootstrap %s` and `controlplane-bootstrap %s`)", abs, components.LogsGatewayCommand, components.RegistryAuthCommand)
	}
	return abs, nil
}

// writeFiles writes the cluster directory: the PKI (kept when it exists), the
// components' kubeconfigs, the encryption and audit configuration, cfgYAML as
// cluster.yaml when it is not nil, and the log directory. Each file is written whole
// (temporary file, then rename). Leaves and credentials it issues are valid for
// leafValidity (zero: a year).
func writeFiles(l components.Layout, cfg *clusterconfig.Config, cfgYAML []byte, leafValidity time.Duration) (*clusterpki.Set, error) {
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	removeStaleTemps(l.Dir)
	set, err := clusterpki.EnsureValidity(l.PKIDir(), cfg, leafValidity)
	if err != nil {
		return nil, err
	}
	for _, kc := range []struct{ file, user, group string }{
		{clusterpki.AdminKubeconfig, clusterpki.AdminUser, clusterpki.AdminGroup},
		{clusterpki.ControllerManagerKubeconfig, clusterpki.ControllerManagerUser, ""},
		{clusterpki.SchedulerKubeconfig, clusterpki.SchedulerUser, ""},
		// Written with monitoring off too, as the monitoring client certificate is, so
		// that `certs renew all` finds it either way.
		{clusterpki.KubeStateMetricsKubeconfig, clusterpki.KubeStateMetricsUser, ""},
		{clusterpki.KueueKubeconfig, clusterpki.KueueUser, ""},
	} {
		var groups []string
		if kc.group != "" {
			groups = []string{kc.group}
		}
		if err := set.EnsureKubeconfig(l.Kubeconfig(kc.file), cfg.ClusterName, cfg.APIServerURL(), kc.user, groups...); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{l.EncryptionConfig(), components.EncryptionConfig(string(set.EncryptionKey)), 0o600},
		{l.AuditPolicy(), components.AuditPolicy, 0o644},
	} {
		if err := atomicfile.WriteMkdirAll(f.path, f.data, f.mode, 0o755); err != nil {
			return nil, err
		}
	}
	if cfgYAML != nil {
		if err := atomicfile.WriteMkdirAll(l.ConfigFile(), cfgYAML, 0o644, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(l.LogDir(), 0o755); err != nil {
		return nil, err
	}
	return set, nil
}

// start starts the components as opts.Mode says and waits until each is healthy; a
// failure in the foreground stops what was started.
func (cp *ControlPlane) start(ctx context.Context, opts Options, specs []components.Component, bins map[string]string, out io.Writer) error {
	if cp.readyTimeout == 0 {
		cp.readyTimeout = 3 * time.Minute
	}
	timeout := cp.readyTimeout
	switch opts.Mode {
	case Foreground:
		if opts.WritePIDFile {
			if err := writePIDFile(cp.Layout.SupervisorPIDFile(), os.Getpid()); err != nil {
				return err
			}
		}
		logf := opts.Logf
		if logf == nil {
			logf = func(format string, args ...any) { fmt.Fprintf(out, "supervisor: "+format+"\n", args...) }
		}
		cp.Supervisor = components.NewSupervisor(logf)
		if err := cp.startForeground(ctx, specs, bins, out, timeout); err != nil {
			cp.Stop()
			return err
		}
		if opts.WritePIDFile {
			// The supervisor of the directory takes `certs renew`'s restart requests. A
			// control plane without it still runs; renewing then says what to do.
			if err := cp.serveRestarts(logf); err != nil {
				logf("not taking restart requests (certs renew will say how to restart by hand): %v", err)
			}
		}
	case Systemd:
		return cp.startSystemd(ctx, specs, bins, opts.UnitDir, out, timeout)
	}
	return nil
}

// load builds the ControlPlane for an existing directory (no processes).
func load(l components.Layout) (*ControlPlane, error) {
	cfg, err := clusterconfig.Load(l.ConfigFile())
	if err != nil {
		return nil, fmt.Errorf("%s holds no control plane (run init first): %w", l.Dir, err)
	}
	set, err := clusterpki.Load(l.PKIDir())
	if err != nil {
		return nil, err
	}
	return &ControlPlane{Layout: l, Config: cfg, PKI: set, readyTimeout: 3 * time.Minute}, nil
}

// Open returns the control plane in dir without starting anything, for
// `token` and `join-config`.
func Open(dir string) (*ControlPlane, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	return load(components.Layout{Dir: abs})
}

func (cp *ControlPlane) startForeground(ctx context.Context, specs []components.Component, bins map[string]string, out io.Writer, timeout time.Duration) error {
	for _, c := range specs {
		if err := cp.beforeStart(ctx, c); err != nil {
			return err
		}
		err := cp.Supervisor.Start(components.Process{
			Name: c.Name, Path: bins[c.Name], Args: c.Args, Env: c.Env,
			LogFile: cp.Layout.LogFile(c.Name), PIDFile: cp.Layout.PIDFile(c.Name),
		})
		if err != nil {
			return err
		}
		if err := cp.waitHealthy(ctx, c, timeout, cp.Supervisor.Exits()); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s healthy\n", c.Name)
	}
	return nil
}

func (cp *ControlPlane) startSystemd(ctx context.Context, specs []components.Component, bins map[string]string, unitDir string, out io.Writer, timeout time.Duration) error {
	if unitDir == "" {
		unitDir = "/etc/systemd/system"
	}
	units := map[string][]byte{}
	var order []string
	prev := ""
	for _, c := range specs {
		name := components.UnitName(c.Name)
		units[name] = components.RenderUnit(c, bins[c.Name], prev, cp.Layout.Dir)
		order = append(order, name)
		prev = c.Name
		// A copy beside the cluster, for operators and for reset.
		if err := atomicfile.WriteMkdirAll(filepath.Join(cp.Layout.UnitDir(), name), units[name], 0o644, 0o755); err != nil {
			return err
		}
	}
	if err := (components.SystemdUnits{Dir: unitDir}).Install(ctx, order, units); err != nil {
		return err
	}
	if err := atomicfile.WriteMkdirAll(cp.Layout.SystemdMarker(), []byte(strings.Join(order, "\n")+"\n"), 0o644, 0o755); err != nil {
		return err
	}
	for _, c := range specs {
		if err := cp.beforeStart(ctx, c); err != nil {
			return err
		}
		if err := cp.waitHealthy(ctx, c, timeout, nil); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s healthy\n", c.Name)
	}
	return nil
}

// waitHealthy polls c's health endpoint until it is ok. A component that
// exits meanwhile fails the wait at once, with the end of its log.
func (cp *ControlPlane) waitHealthy(ctx context.Context, c components.Component, timeout time.Duration, exits <-chan components.Exit) error {
	return cp.waitHealthyExcept(ctx, c, timeout, exits, nil)
}

// waitHealthyExcept is waitHealthy where an exit for which tolerate is true does
// not fail the wait (the supervisor restarts that component itself).
func (cp *ControlPlane) waitHealthyExcept(ctx context.Context, c components.Component, timeout time.Duration, exits <-chan components.Exit, tolerate func(components.Exit) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	prober := cp.prober()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last components.Health
	for {
		last = prober.Probe(ctx, c, 2*time.Second)
		if last.OK {
			return nil
		}
		select {
		case ev := <-exits:
			if tolerate != nil && tolerate(ev) {
				continue
			}
			return cp.componentError(ev.Name, fmt.Errorf("exited during startup (%v)", ev.Err))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return cp.componentError(c.Name, fmt.Errorf("not healthy after %s: %s", timeout, last.Detail))
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (cp *ControlPlane) componentError(name string, err error) error {
	logFile := cp.Layout.LogFile(name)
	tail := components.TailFile(logFile, 8)
	if strings.Contains(tail, "address already in use") {
		err = fmt.Errorf("%w: one of its ports is in use by another process", err)
	}
	return &ComponentError{Component: name, Err: err, LogFile: logFile, LogTail: tail}
}

func (cp *ControlPlane) prober() components.Prober {
	pool := x509.NewCertPool()
	if cp.PKI != nil {
		pool.AddCert(cp.PKI.CA.Cert)
	} else if data, err := os.ReadFile(cp.Layout.PKI(clusterpki.CACert)); err == nil {
		pool.AppendCertsFromPEM(data)
	}
	return components.Prober{ClusterCA: pool}
}

// Probe checks every component once.
func (cp *ControlPlane) Probe(ctx context.Context) []components.Health {
	var hs []components.Health
	for _, c := range components.Specs(cp.Config, cp.Layout) {
		hs = append(hs, cp.prober().Probe(ctx, c, 3*time.Second))
	}
	return hs
}

// RESTConfig is the admin client configuration.
func (cp *ControlPlane) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig())
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	cfg.UserAgent = "controlplane-bootstrap"
	// client-go's default of 5 requests a second made `tenants diff` and `tenants
	// apply` wait about 20 s on its own limiter for a handful of tenants (two requests
	// per object); this is the cluster's admin on its own control plane.
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, nil
}

// Clientset is an admin clientset.
func (cp *ControlPlane) Clientset() (*kubernetes.Clientset, error) {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// applyJoinMaterial applies joinconfig.Objects, the cluster DNS
// (clusterdns.Objects) and the node-local volumes' objects
// (localvolumes.Objects) and gpuboot's Machine CRD (kubestore.CRD), retrying while the apiserver finishes its own
// bootstrap (default RBAC, namespaces), and waits until their admission
// policies are enforced.
func (cp *ControlPlane) applyJoinMaterial(ctx context.Context) error {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	objs, err := joinconfig.Objects(cp.Config, cp.PKI.CACertPEM())
	if err != nil {
		return err
	}
	dns, err := clusterdns.Objects(cp.Config)
	if err != nil {
		return err
	}
	objs = append(objs, dns...)
	objs = append(objs, localvolumes.Objects(cp.Config.Storage.NFS)...)
	objs = append(objs, monitoringObjects(cp.Config)...)
	crd, err := kubestore.CRD()
	if err != nil {
		return err
	}
	objs = append(objs, joinconfig.Object{GVR: gvrCRD, Obj: crd})
	err = applyRetrying(ctx, dyn, objs)
	if err != nil {
		return fmt.Errorf("apply join material: %w", err)
	}
	if err := waitEstablished(ctx, dyn, kubestore.CRDName); err != nil {
		return err
	}
	if err := joinconfig.WaitEnrollerPolicy(ctx, cfg); err != nil {
		return err
	}
	return localvolumes.WaitPolicy(ctx, cfg)
}

// removeStaleTemps deletes temporary files and directories an interrupted
// earlier run left (".NAME.tmp-*"), so they cannot be mistaken for data.
func removeStaleTemps(dir string) {
	for _, pattern := range []string{".*.tmp-*", "pki/.*.tmp-*", "pki/etcd/.*.tmp-*", "config/.*.tmp-*", "units/.*.tmp-*"} {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range matches {
			os.RemoveAll(m)
		}
	}
}

// PID files hold "PID STARTTIME" so that a recycled PID is not mistaken for
// the supervisor (STARTTIME is field 22 of /proc/PID/stat).
func writePIDFile(path string, pid int) error {
	st, err := procStartTime(pid)
	if err != nil {
		return err
	}
	return atomicfile.WriteMkdirAll(path, fmt.Appendf(nil, "%d %s\n", pid, st), 0o644, 0o755)
}

func readPIDFile(path string) (int, string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, ""
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, ""
	}
	pid, _ := strconv.Atoi(f[0])
	if len(f) < 2 {
		return pid, ""
	}
	return pid, f[1]
}

func procStartTime(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return f[19], nil
}

// runningSupervisor returns the PID of the supervisor recorded in l and
// whether that process is still the one that wrote it.
func runningSupervisor(l components.Layout) (int, bool) {
	pid, start := readPIDFile(l.SupervisorPIDFile())
	if pid <= 0 {
		return 0, false
	}
	st, err := procStartTime(pid)
	if err != nil || (start != "" && st != start) {
		return pid, false
	}
	return pid, syscall.Kill(pid, 0) == nil
}

// alreadyRunning reports whether a control plane is running in l: a live
// supervisor other than this process, every systemd unit init installed for it
// running, or every component alive under the PIDs recorded for it.
func alreadyRunning(ctx context.Context, l components.Layout) (string, bool) {
	if pid, alive := runningSupervisor(l); alive && pid != os.Getpid() {
		return fmt.Sprintf("supervisor pid %d", pid), true
	}
	if by, running := runningUnits(ctx, l); running {
		return by, true
	}
	var pids []string
	for _, name := range components.Names {
		pid, _ := readPIDFile(l.PIDFile(name))
		if pid <= 0 || !isComponent(pid, name) {
			return "", false
		}
		pids = append(pids, fmt.Sprintf("%s pid %d", name, pid))
	}
	return strings.Join(pids, ", "), true
}

// runningUnits reports whether every unit init installed for l (the systemd marker
// lists them) is running, and names their main PIDs. Units run without PID files, so
// only systemd can say.
func runningUnits(ctx context.Context, l components.Layout) (string, bool) {
	data, err := os.ReadFile(l.SystemdMarker())
	units := strings.Fields(string(data))
	if err != nil || len(units) == 0 || !components.SystemdBooted() {
		return "", false
	}
	pids, err := (components.SystemdUnits{}).Running(ctx, units)
	if err != nil || len(pids) != len(units) {
		return "", false
	}
	var by []string
	for _, u := range units {
		by = append(by, fmt.Sprintf("%s pid %d", u, pids[u]))
	}
	return strings.Join(by, ", "), true
}

// applyRetrying applies objs, trying again every 250 ms for up to a minute while the
// apiserver refuses them (a just-started apiserver's CRDs and admission catch up).
func applyRetrying(ctx context.Context, dyn dynamic.Interface, objs []joinconfig.Object) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := joinconfig.Apply(ctx, dyn, objs)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// ComponentStatus is one component in a Status report.
type ComponentStatus struct {
	Name   string
	PID    int // 0 when unknown (systemd mode) or not running
	Health components.Health
}

// Status is what `controlplane-bootstrap status` prints.
type Status struct {
	Dir           string
	Mode          string // "foreground (supervisor pid N)", "systemd units", "stopped"
	SupervisorPID int
	Components    []ComponentStatus
	// VIP is the floating API address and its holder, when apiServer.vip has one.
	VIP *VIPStatus
	// Etcd is etcd's membership and each member's health, while the control plane runs.
	Etcd *EtcdStatus
}

// VIPStatus is the floating API address (apiServer.vip) in a Status report.
type VIPStatus struct {
	Address string // apiServer.vip.address
	// Holder is the name of the host that holds it now, "" when none does or when it
	// could not be told (Err).
	Holder string
	// Err says why the holder is unknown: the vip component that answers /leader is
	// not running, or it cannot read etcd.
	Err string
}

// Healthy reports whether every component is healthy.
func (s Status) Healthy() bool {
	for _, c := range s.Components {
		if !c.Health.OK {
			return false
		}
	}
	return len(s.Components) > 0
}

// GetStatus probes the control plane in dir.
func GetStatus(ctx context.Context, dir string) (Status, error) {
	cp, err := Open(dir)
	if err != nil {
		return Status{}, err
	}
	l := cp.Layout
	st := Status{Dir: l.Dir, Mode: "stopped"}
	if pid, alive := runningSupervisor(l); alive {
		st.SupervisorPID = pid
		st.Mode = fmt.Sprintf("foreground (supervisor pid %d)", pid)
	} else if _, err := os.Stat(l.SystemdMarker()); err == nil {
		st.Mode = "systemd units"
	}
	for _, h := range cp.Probe(ctx) {
		cs := ComponentStatus{Name: h.Component, Health: h}
		if pid, _ := readPIDFile(l.PIDFile(h.Component)); pid > 0 && isComponent(pid, h.Component) {
			cs.PID = pid
		}
		st.Components = append(st.Components, cs)
	}
	for _, c := range st.Components {
		if c.Name == components.Etcd && c.Health.OK {
			es := GetEtcdStatus(ctx, cp.Config, l)
			st.Etcd = &es
		}
	}
	if v := cp.Config.APIServer.VIP; v.Enabled() {
		st.VIP = &VIPStatus{Address: v.Address}
		st.VIP.Holder, err = components.VIPHolder(ctx, components.VIPLeaderURL(cp.Config))
		if err != nil {
			st.VIP.Err = err.Error()
		}
	}
	return st, nil
}

// selfCommands are the subcommands of the components that are this program.
var selfCommands = map[string]string{
	components.LogsGateway:  components.LogsGatewayCommand,
	components.RegistryAuth: components.RegistryAuthCommand,
	components.VIP:          components.VIPCommand,
}

// isComponent reports whether pid is alive and runs the binary name, or, for the log
// gateway, the registry's token issuer and the floating address's holder, any program
// with its subcommand first (controlplane-bootstrap logs-gateway).
func isComponent(pid int, name string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	if sub, ok := selfCommands[name]; ok {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		return err == nil && len(args) > 1 && args[1] == sub
	}
	return filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == name
}

// Stop stops the control plane in dir: it asks its supervisor to stop (and
// waits), stops its systemd units, and terminates any component process a
// vanished supervisor left behind. Stopping a stopped control plane is not
// an error.
func Stop(ctx context.Context, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	l := components.Layout{Dir: abs}
	if pid, alive := runningSupervisor(l); alive {
		if pid == os.Getpid() {
			return errors.New("this process supervises the control plane; stop it with its handle, not with Stop")
		}
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return fmt.Errorf("signal supervisor pid %d: %w", pid, err)
		}
		if !waitGone(ctx, pid, 60*time.Second) {
			return fmt.Errorf("supervisor pid %d did not exit within 60s after SIGTERM", pid)
		}
	}
	if data, err := os.ReadFile(l.SystemdMarker()); err == nil {
		if err := (components.SystemdUnits{}).Stop(ctx, strings.Fields(string(data))); err != nil {
			return err
		}
	}
	for i := len(components.AllNames) - 1; i >= 0; i-- {
		name := components.AllNames[i]
		pid, _ := readPIDFile(l.PIDFile(name))
		if pid > 0 && isComponent(pid, name) {
			syscall.Kill(pid, syscall.SIGTERM)
			if !waitGone(ctx, pid, 20*time.Second) {
				syscall.Kill(pid, syscall.SIGKILL)
				waitGone(ctx, pid, 5*time.Second)
			}
		}
		os.Remove(l.PIDFile(name))
	}
	os.Remove(l.SupervisorPIDFile())
	return nil
}

// waitGone waits up to d for pid to exit. A process that has exited but that its
// parent has not reaped yet (a zombie: a supervisor started by a script or a test that
// waits for it later) is gone too: it runs nothing and holds no port.
func waitGone(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if exited(pid) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return exited(pid)
}

// exited reports whether pid is no longer running: there is no such process, or it is
// a zombie (state Z in /proc/PID/stat).
func exited(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// LooksLikeClusterDir reports whether dir holds a control plane made by init
// (cluster.yaml or pki/ca.crt), the guard before Reset deletes it.
func LooksLikeClusterDir(dir string) bool {
	l := components.Layout{Dir: dir}
	for _, p := range []string{l.ConfigFile(), l.PKI("ca.crt")} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// Reset removes this host's etcd member from the cluster when other members remain
// (several control-plane hosts), then stops the control plane in dir, removes its
// systemd units and deletes dir with everything in it (etcd data, PKI, logs). The
// caller asks the operator first.
func Reset(ctx context.Context, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !LooksLikeClusterDir(abs) {
		return fmt.Errorf("%s does not look like a cluster directory (no cluster.yaml, no pki/ca.crt); refusing to delete it", abs)
	}
	l := components.Layout{Dir: abs}
	// Leave etcd first, while this member still runs: the others then stop counting it.
	if err := leaveEtcd(ctx, l); err != nil {
		return err
	}
	if err := Stop(ctx, abs); err != nil {
		return err
	}
	if data, err := os.ReadFile(l.SystemdMarker()); err == nil {
		if err := (components.SystemdUnits{Dir: "/etc/systemd/system"}).Remove(ctx, strings.Fields(string(data))); err != nil {
			return err
		}
	}
	return os.RemoveAll(abs)
}

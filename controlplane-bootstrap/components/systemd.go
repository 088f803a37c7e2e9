package components

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// UnitName is the systemd unit that runs component name.
func UnitName(name string) string { return "gpurack-" + name + ".service" }

// SystemdBooted reports whether this host's PID 1 is systemd, the test
// sd_booted(3) makes: /run/systemd/system is a directory.
func SystemdBooted() bool {
	st, err := os.Stat("/run/systemd/system")
	return err == nil && st.IsDir()
}

// RenderUnit returns the systemd unit file that runs c from binary. Each
// component after etcd wants and starts after the one before it; systemd
// restarts a crashed one (Restart=always) with a short delay. The service may
// write only under dir, the cluster directory, and c.Writes, and keeps no capability
// but c.Capabilities (hardening: decision 0690).
func RenderUnit(c Component, binary, after, dir string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by controlplane-bootstrap init; it is rewritten on the next init.\n")
	fmt.Fprintf(&b, "[Unit]\nDescription=gpurack control plane: %s\nDocumentation=https://kubernetes.io/docs/reference/command-line-tools-reference/\n", c.Name)
	b.WriteString("After=network-online.target")
	if after != "" {
		b.WriteString(" " + UnitName(after))
	}
	b.WriteString("\nWants=network-online.target")
	if after != "" {
		b.WriteString(" " + UnitName(after))
	}
	b.WriteString("\n\n[Service]\n")
	b.WriteString("ExecStart=" + systemdQuote(binary))
	for _, a := range c.Args {
		b.WriteString(" \\\n\t" + systemdQuote(a))
	}
	b.WriteString("\nRestart=always\nRestartSec=2s\nLimitNOFILE=1048576\n")
	for _, e := range c.Env {
		b.WriteString("Environment=" + systemdQuote(e) + "\n")
	}
	if c.Name == Etcd {
		b.WriteString("Type=notify\nNotifyAccess=main\n")
	}
	b.WriteString(sandbox(c))
	b.WriteString("ReadWritePaths=" + systemdQuote(dir))
	for _, w := range c.Writes {
		b.WriteString(" " + systemdQuote(w))
	}
	b.WriteString("\n\n[Install]\nWantedBy=multi-user.target\n")
	return []byte(b.String())
}

// hardening is every control-plane unit's sandbox (decision 0690). The components
// run as root (they own the cluster directory's keys) but need no capability: their
// ports are above 1024 and every file they touch is root's own. The one exception is
// the floating API address's holder (vip), whose unit keeps CAP_NET_ADMIN and
// CAP_NET_RAW and may open packet sockets (sandbox). The file system is
// read-only but the cluster directory (ReadWritePaths, added per unit) and the
// binaries' home, which may be under /root (the pinned cache), stays readable.
const hardening = `# Sandbox (decision 0690): no capabilities, the file system read-only but the cluster directory.
NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelModules=yes
ProtectKernelTunables=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
`

// sandbox is hardening with c's capabilities and extra socket families, each on the
// one line that sets it.
func sandbox(c Component) string {
	if len(c.Capabilities) == 0 && len(c.AddressFamilies) == 0 {
		return hardening
	}
	h := strings.Replace(hardening, "\nCapabilityBoundingSet=\n",
		"\n# The exception (vip): it keeps what it needs to change this host's addresses and send ARP.\nCapabilityBoundingSet="+strings.Join(c.Capabilities, " ")+"\n", 1)
	families := "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK"
	return strings.Replace(h, families+"\n", families+" "+strings.Join(c.AddressFamilies, " ")+"\n", 1)
}

// systemdQuote quotes s for an ExecStart= line when it holds characters
// systemd would split or expand.
func systemdQuote(s string) string {
	if !strings.ContainsAny(s, " \t\"'\\$%;") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `$$`, `%`, `%%`)
	return `"` + r.Replace(s) + `"`
}

// SystemdUnits installs, enables and starts units over D-Bus. It is used
// only on hosts where SystemdBooted is true.
type SystemdUnits struct {
	// Dir is where unit files go, normally /etc/systemd/system.
	Dir string
}

// Install writes each unit file (name → content) into Dir, reloads systemd,
// enables them and starts them in the order given, waiting for each start
// job to finish.
func (s SystemdUnits) Install(ctx context.Context, order []string, units map[string][]byte) error {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd over D-Bus: %w (is this host booted with systemd? use --foreground otherwise)", err)
	}
	defer conn.Close()
	var paths []string
	for _, name := range order {
		p := filepath.Join(s.Dir, name)
		if err := os.WriteFile(p, units[name], 0o644); err != nil {
			return fmt.Errorf("write unit %s: %w", p, err)
		}
		paths = append(paths, p)
	}
	if err := conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("systemd daemon-reload: %w", err)
	}
	if _, _, err := conn.EnableUnitFilesContext(ctx, paths, false, true); err != nil {
		return fmt.Errorf("enable units: %w", err)
	}
	return restartInOrder(ctx, conn, "start", order)
}

// Restart restarts the units in the order given, waiting for each restart job to
// finish before the next.
func (s SystemdUnits) Restart(ctx context.Context, order []string) error {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	return restartInOrder(ctx, conn, "restart", order)
}

// restartInOrder (re)starts the units in order, each job finished before the next;
// verb names the step in errors.
func restartInOrder(ctx context.Context, conn *sddbus.Conn, verb string, order []string) error {
	for _, name := range order {
		done := make(chan string, 1)
		if _, err := conn.RestartUnitContext(ctx, name, "replace", done); err != nil {
			return fmt.Errorf("%s %s: %w", verb, name, err)
		}
		select {
		case result := <-done:
			if result != "done" {
				return fmt.Errorf("%s %s: job %s (see `journalctl -u %s`)", verb, name, result, name)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Running returns the main PID of each of the units that is active and running, read
// over D-Bus; a unit that is not (stopped, failed, restarting, not loaded) is left out.
func (s SystemdUnits) Running(ctx context.Context, names []string) (map[string]uint32, error) {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	states, err := conn.ListUnitsByNamesContext(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("list units %s: %w", strings.Join(names, " "), err)
	}
	pids := map[string]uint32{}
	for _, st := range states {
		if st.ActiveState != "active" || st.SubState != "running" {
			continue
		}
		p, err := conn.GetServicePropertyContext(ctx, st.Name, "MainPID")
		if err != nil {
			return nil, fmt.Errorf("%s MainPID: %w", st.Name, err)
		}
		if pid, ok := p.Value.Value().(uint32); ok && pid > 0 {
			pids[st.Name] = pid
		}
	}
	return pids, nil
}

// Stop stops the units in the order given.
func (s SystemdUnits) Stop(ctx context.Context, order []string) error {
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	for _, name := range order {
		done := make(chan string, 1)
		if _, err := conn.StopUnitContext(ctx, name, "replace", done); err != nil {
			return fmt.Errorf("stop %s: %w", name, err)
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Remove stops, disables and deletes the units.
func (s SystemdUnits) Remove(ctx context.Context, order []string) error {
	if err := s.Stop(ctx, order); err != nil {
		return err
	}
	conn, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.DisableUnitFilesContext(ctx, order, false); err != nil {
		return fmt.Errorf("disable units: %w", err)
	}
	for _, name := range order {
		os.Remove(filepath.Join(s.Dir, name))
	}
	return conn.ReloadContext(ctx)
}

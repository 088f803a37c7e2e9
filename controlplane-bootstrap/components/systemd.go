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
// restarts a crashed one (Restart=always) with a short delay.
func RenderUnit(c Component, binary string, after string) []byte {
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
	if c.Name == Etcd {
		b.WriteString("Type=notify\nNotifyAccess=main\n")
	}
	b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	return []byte(b.String())
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
	for _, name := range order {
		done := make(chan string, 1)
		if _, err := conn.RestartUnitContext(ctx, name, "replace", done); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		select {
		case result := <-done:
			if result != "done" {
				return fmt.Errorf("start %s: job %s (see `journalctl -u %s`)", name, result, name)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
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

package kubejoin

import (
	"context"
	"fmt"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// SystemdHost is Host over the system bus. It needs systemd as PID 1 (and
// systemd-hostnamed, started on demand by D-Bus activation).
type SystemdHost struct{}

// SetTransientHostname calls org.freedesktop.hostname1.SetHostname(name, interactive=false).
func (SystemdHost) SetTransientHostname(ctx context.Context, name string) error {
	conn, err := dbus.ConnectSystemBus(dbus.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("system bus: %w", err)
	}
	defer conn.Close()
	obj := conn.Object("org.freedesktop.hostname1", "/org/freedesktop/hostname1")
	return obj.CallWithContext(ctx, "org.freedesktop.hostname1.SetHostname", 0, name, false).Err
}

// StartUnit starts unit (mode "replace") and waits for the job to finish.
func (SystemdHost) StartUnit(ctx context.Context, unit string) error {
	return runUnitJob(ctx, unit, (*sddbus.Conn).StartUnitContext)
}

// RestartUnit restarts unit (starts it when it is not running; mode "replace") and
// waits for the job to finish: a unit that reads its files at start (node-exporter's
// credentials) takes new ones.
func (SystemdHost) RestartUnit(ctx context.Context, unit string) error {
	return runUnitJob(ctx, unit, (*sddbus.Conn).RestartUnitContext)
}

// runUnitJob queues a job for unit with the system manager through job (mode
// "replace") and waits for it to finish.
func runUnitJob(ctx context.Context, unit string, job func(*sddbus.Conn, context.Context, string, string, chan<- string) (int, error)) error {
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := job(conn, ctx, unit, "replace", done); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case r := <-done:
		if r != "done" {
			return fmt.Errorf("job for %s ended %q (journalctl -u %s)", unit, r, unit)
		}
		return nil
	}
}

// EnsureService starts argv as the transient service unit (Type=notify,
// Restart=always, one second apart) and waits for it to be ready, or leaves the unit be
// when it is already running (an agent restarted within a boot): started says which. A
// transient unit is not part of the agent's unit, so it outlives the agent's restarts,
// and it is gone at the next boot.
func (SystemdHost) EnsureService(ctx context.Context, unit, description string, argv []string) (started bool, err error) {
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return false, fmt.Errorf("systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	if p, err := conn.GetUnitPropertyContext(ctx, unit, "ActiveState"); err == nil {
		switch p.Value.Value() {
		case "active", "activating", "reloading":
			return false, nil
		}
	}
	// A transient unit that failed stays loaded, and its name taken, until reset.
	_ = conn.ResetFailedUnitContext(ctx, unit)
	props := []sddbus.Property{
		sddbus.PropDescription(description),
		sddbus.PropExecStart(argv, false),
		sddbus.PropType("notify"),
		{Name: "Restart", Value: dbus.MakeVariant("always")},
		{Name: "RestartUSec", Value: dbus.MakeVariant(uint64(time.Second / time.Microsecond))},
	}
	done := make(chan string, 1)
	if _, err := conn.StartTransientUnitContext(ctx, unit, "replace", props, done); err != nil {
		return false, fmt.Errorf("start %s: %w", unit, err)
	}
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case r := <-done:
		if r != "done" {
			return false, fmt.Errorf("job for %s ended %q (journalctl -u %s)", unit, r, unit)
		}
		return true, nil
	}
}

package kubejoin

import (
	"context"
	"fmt"

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

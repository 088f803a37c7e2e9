package datadisk

import (
	"context"
	"fmt"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/coreos/go-systemd/v22/unit"
	"github.com/godbus/dbus/v5"
)

// MountFunc mounts the filesystem of type fstype on dev at target with options (as
// mount(8) writes them).
type MountFunc func(ctx context.Context, dev, target, fstype, options string) error

// SystemdMount is the agent's MountFunc: systemd mounts the filesystem, through a
// transient mount unit (org.freedesktop.systemd1 StartTransientUnit), in the host's
// mount namespace. The agent's own unit has a mount namespace of its own
// (ProtectSystem=, PrivateTmp=), from which nothing propagates to the host: a mount
// made there is invisible to kubelet and pods, whose writes would land in the
// memory-backed root and vanish at the next boot. Mounts in the host's namespace do
// propagate into the agent's, so it then sees the disk where it expects it.
//
// A unit of the same name left failed by an earlier try is reset first. The unit is
// transient: gone at the next boot, when the agent mounts the disk again.
func SystemdMount(ctx context.Context, dev, target, fstype, options string) error {
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("mount %s at %s through systemd: %w", dev, target, err)
	}
	defer conn.Close()
	name := unit.UnitNamePathEscape(target) + ".mount"
	props := []sddbus.Property{
		sddbus.PropDescription("gpurack data disk " + dev),
		{Name: "What", Value: dbus.MakeVariant(dev)},
		{Name: "Where", Value: dbus.MakeVariant(target)},
		{Name: "Type", Value: dbus.MakeVariant(fstype)},
		{Name: "Options", Value: dbus.MakeVariant(options)},
	}
	_ = conn.ResetFailedUnitContext(ctx, name) // nothing to reset is an error too
	done := make(chan string, 1)
	if _, err := conn.StartTransientUnitContext(ctx, name, "replace", props, done); err != nil {
		if !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("mount %s at %s through systemd (unit %s): %w", dev, target, name, err)
		}
		// Loaded but inactive (unmounted since): start it again.
		if _, err := conn.StartUnitContext(ctx, name, "replace", done); err != nil {
			return fmt.Errorf("mount %s at %s through systemd (unit %s): %w", dev, target, name, err)
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case r := <-done:
		if r != "done" {
			return fmt.Errorf("mount %s at %s: systemd's job for %s ended %q (journalctl -u %s; the kernel log says why a mount failed)", dev, target, name, r, name)
		}
		return nil
	}
}

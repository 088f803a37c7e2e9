package enroll

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/proto"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// The actions a data-disk wipe records in a machine's history (inventory.Record,
// Transition.action in api/boot/v1/admin.proto).
const (
	ActionWipeRequested = "wipe-data-disk requested"
	ActionWipeDone      = "wipe-data-disk done"
	ActionWipeRefused   = "wipe-data-disk refused"
)

// WipeDataDisk asks the machine ref's agent to wipe the data disk at path
// (AdminService.WipeDataDisk, docs/storage.md). serial is the operator's confirmation:
// it must be exactly the serial the agent last reported for path. The request is kept
// on the machine (PendingWipe) and recorded in its history; Heartbeat hands it to the
// agent over mutual TLS until the agent reports what it did.
//
// A missing reason, path or serial is ErrInvalid; everything wipeRefusal refuses is
// ErrPrecondition.
func (s *Service) WipeDataDisk(ctx context.Context, ref, path, serial, actor, reason string) (*inventory.Machine, error) {
	switch {
	case strings.TrimSpace(reason) == "":
		return nil, fmt.Errorf("%w: a reason is required: it is recorded in the machine's history", ErrInvalid)
	case path == "":
		return nil, fmt.Errorf("%w: name the disk by its device path, as `gpuboot machines show` lists it (e.g. /dev/nvme1n1)", ErrInvalid)
	case serial == "":
		return nil, fmt.Errorf("%w: the disk's serial is required, as confirmation that %s is the disk you mean", ErrInvalid, path)
	}
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	id, err := newWipeID()
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	return s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if err := wipeRefusal(m, path, serial); err != nil {
			return nil, err
		}
		m.PendingWipe = &inventory.DataDiskWipe{ID: id, Path: path, Serial: serial, Actor: actor, Reason: reason, RequestedAt: now.UTC()}
		t, err := inventory.Record(m, ActionWipeRequested, actor, fmt.Sprintf("%s serial %s: %s", path, serial, reason), now)
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
}

// wipeStates are where a wipe may be asked for (admin.proto, WipeDataDisk): a bound
// machine whose agent heartbeats. An approved machine's agent takes the request once it
// joined (the answer carries it over mutual TLS only).
var wipeStates = []inventory.State{inventory.Approved, inventory.Joining, inventory.Ready}

// wipeRefusal says why the disk at path of m may not be wiped on the operator's word
// serial, or nil when it may. It decides on the agent's latest report only; the agent
// checks the disk again before it writes.
func wipeRefusal(m *inventory.Machine, path, serial string) error {
	stateOK := false
	for _, st := range wipeStates {
		stateOK = stateOK || m.State == st
	}
	if !stateOK {
		return fmt.Errorf("%w: machine %s is %s; a data-disk wipe is asked of a machine that is approved, joining or ready", ErrPrecondition, m.ID, m.State)
	}
	if w := m.PendingWipe; w != nil {
		return fmt.Errorf("%w: machine %s has a wipe pending (%s serial %s, asked by %s at %s): wait for the agent's result in `gpuboot machines history %s`",
			ErrPrecondition, m.ID, w.Path, w.Serial, w.Actor, w.RequestedAt.Format(time.RFC3339), m.ID)
	}
	disks := new(machinev1.DataDisks)
	if m.DataDisksAt.IsZero() || proto.Unmarshal(m.DataDisks, disks) != nil || len(disks.GetDisks()) == 0 {
		return fmt.Errorf("%w: the agent of machine %s has reported no disks (it looks once the machine is approved): there is no disk %s to wipe", ErrPrecondition, m.ID, path)
	}
	var d *machinev1.DataDisk
	var paths []string
	for _, x := range disks.GetDisks() {
		paths = append(paths, x.GetPath())
		if x.GetPath() == path {
			d = x
		}
	}
	if d == nil {
		return fmt.Errorf("%w: the agent of machine %s has not reported a disk at %s; it reported %s", ErrPrecondition, m.ID, path, strings.Join(paths, ", "))
	}
	if d.GetSerial() == "" {
		return fmt.Errorf("%w: the agent reported no serial for %s, so a wipe cannot be confirmed and the agent would refuse it; wipe that disk by hand (wipefs -a) if it must be", ErrPrecondition, path)
	}
	if serial != d.GetSerial() {
		// The true serial is not echoed: the serial is the operator's confirmation that
		// they looked at this disk, and an error that hands it over invites pasting it
		// back without looking. `gpuboot machines show` lists it beside the disk's
		// model, size and what it holds, which is where it should be read.
		return fmt.Errorf("%w: serial %q does not match the serial the agent reported for %s: check the disk in `gpuboot machines show %s`", ErrPrecondition, serial, path, m.ID)
	}
	switch d.GetState() {
	case machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, machinev1.DataDiskState_DATA_DISK_STATE_FAILED:
		return nil
	case machinev1.DataDiskState_DATA_DISK_STATE_READY:
		return fmt.Errorf("%w: %s is this cluster's data disk, ready and mounted at %s: it needs no wipe, and wiping it would destroy the volumes this cluster keeps on it, which is decommissioning data, not preparing a disk", ErrPrecondition, path, d.GetMountPoint())
	}
	return fmt.Errorf("%w: no storage.dataDisks rule of the machine's profile selects %s, so the agent does not use it and a wipe would not change that: select it first (docs/storage.md)", ErrPrecondition, path)
}

// newWipeID returns a fresh id for a wipe request: "wipe-" and 24 hex digits.
func newWipeID() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("wipe request id: %w", err)
	}
	return "wipe-" + hex.EncodeToString(b), nil
}

// applyWipeResult takes the agent's report r on m's pending wipe: the wipe is no longer
// pending, and its outcome is recorded ("wipe-data-disk done", or "refused" with the
// agent's error). A result that names no pending wipe changes nothing: ignored says
// so, for the log (the agent may repeat a result gpuboot has taken already).
func applyWipeResult(m *inventory.Machine, c *caller, r *machinev1.DataDiskWipeResult, now time.Time) (ts []inventory.Transition, ignored string, err error) {
	w := m.PendingWipe
	if w == nil || r.GetId() != w.ID {
		pending := "none"
		if w != nil {
			pending = w.ID
		}
		return nil, fmt.Sprintf("result for wipe %q, pending: %s", r.GetId(), pending), nil
	}
	action, reason := ActionWipeDone, fmt.Sprintf("%s serial %s wiped (asked by %s)", w.Path, w.Serial, w.Actor)
	if !r.GetWiped() {
		action, reason = ActionWipeRefused, oneLine(r.GetError())
		if reason == "" {
			reason = fmt.Sprintf("%s serial %s not wiped; the agent gave no reason", w.Path, w.Serial)
		}
	}
	t, err := inventory.Record(m, action, agentActor(c.fp), reason, now)
	if err != nil {
		return nil, "", err
	}
	m.PendingWipe = nil
	return []inventory.Transition{t}, "", nil
}

// oneLine is agent text made one line for the history: control characters become
// spaces, and the ends are trimmed.
func oneLine(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s))
}

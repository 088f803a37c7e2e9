package enroll

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/protobuf/proto"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// BootAction is what a /boot.ipxe request gets.
type BootAction int

// The boot actions.
const (
	// BootImage boots ImageID.
	BootImage BootAction = iota + 1
	// BootHold shows "waiting for approval" and re-chains /boot.ipxe (CONTRACTS §2.2).
	BootHold
)

// BootDecision is the answer to a boot request.
type BootDecision struct {
	Action  BootAction
	ImageID string
	// MachineID is the inventory id, empty when the request was not recorded.
	MachineID string
	// Reason says why, for logs and the hold script.
	Reason string
}

// DecideBoot handles a /boot.ipxe request for id from remote (CONTRACTS §2.1, §2.2):
// an unknown identity is recorded as discovered (within the bounds on unauthenticated
// creations); for a known identity the request is only recorded (LastBootAt); a
// decommissioned machine starts over as discovered, its allowlist approval still spent
// (inventory.Machine.AllowlistSpent) when it had one, so only an operator approves it. remote is logged only: nothing is
// decided on it.
//
// The request is unauthenticated: anyone who read a machine's MAC, UUID and serial off
// the wire can send it. So it never ends a key, revokes a certificate or moves a
// machine that has a key (decision 0405): a rebooted machine's new key takes over once
// the old key stopped calling (inventory.KeyLiveness), or when an operator says so.
func (s *Service) DecideBoot(ctx context.Context, id identity.Identity, remote netip.Addr) (BootDecision, error) {
	now := s.cfg.Now()
	if id.MAC == "" {
		return BootDecision{}, errors.New("boot request without a MAC address")
	}
	m, err := s.store.Lookup(ctx, id.Key())
	if errors.Is(err, inventory.ErrNotFound) {
		m, err = s.discover(ctx, id, remote, now)
		if errors.Is(err, inventory.ErrExists) {
			m, err = s.store.Lookup(ctx, id.Key())
		}
		if errors.Is(err, ErrLimited) {
			s.log.Warn("boot request not recorded", "mac", id.MAC, "remote", remote, "err", err)
			return BootDecision{Action: BootHold, Reason: "gpuboot is not recording new machines right now; retrying"}, nil
		}
		if err != nil {
			return BootDecision{}, err
		}
		return s.bootDecision(m), nil
	}
	if err != nil {
		return BootDecision{}, err
	}
	m, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		m.LastBootAt = now.UTC()
		if m.State == inventory.Decommissioned {
			m.Keys, m.BoundKey, m.Approval, m.NodeName = nil, "", nil, ""
			m.Facts, m.Checklist, m.CommissioningReport, m.Health, m.GPUAllocation = nil, nil, nil, nil, nil
			m.GPUAllocationAt = time.Time{}
			m.DataDisks, m.DataDisksAt = nil, time.Time{}
			reason := fmt.Sprintf("decommissioned machine booted again (from %s)", remote)
			if m.AllowlistSpent {
				// Anyone can send this request: it starts the record over, and
				// AllowlistSpent stays, so no allowlist row approves what registers.
				reason += "; its allowlist approval is spent: only an operator approves it"
				s.log.Warn("a decommissioned machine booted again: it waits for an operator (gpuboot machines approve), its allowlist row no longer approves it",
					"machine", m.ID, "mac", id.MAC, "serial", id.Serial, "remote", remote)
			}
			t, err := inventory.Move(m, inventory.Discovered, "gpuboot", reason, now)
			if err != nil {
				return nil, err
			}
			m.ImageID, m.Profile = s.imageAndProfile(m)
			return []inventory.Transition{t}, nil
		}
		m.ImageID, m.Profile = s.imageAndProfile(m)
		return nil, nil
	})
	if err != nil {
		return BootDecision{}, err
	}
	return s.bootDecision(m), nil
}

func (s *Service) discover(ctx context.Context, id identity.Identity, remote netip.Addr, now time.Time) (*inventory.Machine, error) {
	m := &inventory.Machine{ID: inventory.NewID(), Identity: id, CreatedAt: now.UTC(), LastBootAt: now.UTC(), Rack: s.cfg.DefaultRack}
	d := s.cfg.Policy.Decide(id)
	if d.EKHash != "" && !s.cfg.Identity.usesTPM() {
		// The row names a TPM no key proves under mac-uuid-serial: it approves
		// nothing (checkManifestEK).
		d.Approve = false
	}
	if d.ByAllowlist() {
		// Held while this machine is created, so two identities on one row are
		// never both approved.
		s.rowMu.Lock()
		defer s.rowMu.Unlock()
		holder, err := s.rowHolder(ctx, id, d)
		if err != nil {
			return nil, err
		}
		if holder != "" {
			s.log.Warn("allowlist row already bound to another machine: not approved", "mac", id.MAC, "serial", id.Serial, "uuid", id.UUID,
				"row", d.Line, "boundTo", holder, "remote", remote)
			d.Approve = false
		}
	}
	if d.Rack != "" {
		m.Rack = d.Rack
	}
	m.Slot, m.BMC = d.Slot, d.BMC
	m.ImageID, m.Profile = s.imageAndProfile(m)
	t, err := inventory.Move(m, inventory.Discovered, "gpuboot", fmt.Sprintf("first boot request (from %s)", remote), now)
	if err != nil {
		return nil, err
	}
	ts := []inventory.Transition{t}
	if d.Approve {
		t2, err := inventory.Move(m, inventory.Approved, d.Actor, d.Reason, now)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t2)
	}
	if err := s.create(ctx, m, ts...); err != nil {
		return nil, err
	}
	s.log.Info("machine discovered", "machine", m.ID, "mac", id.MAC, "serial", id.Serial, "remote", remote, "state", m.State)
	return m, nil
}

// bootDecision is the pure part of DecideBoot.
func (s *Service) bootDecision(m *inventory.Machine) BootDecision {
	d := BootDecision{MachineID: m.ID}
	switch m.State {
	case inventory.Rejected:
		d.Action, d.Reason = BootHold, "rejected by an operator"
		return d
	case inventory.Discovered, inventory.Registered:
		if s.cfg.UnknownMachines == Hold {
			d.Action, d.Reason = BootHold, "waiting for approval"
			return d
		}
	}
	img, _ := s.ImageFor(m)
	if img == "" {
		d.Action, d.Reason = BootHold, fmt.Sprintf("no image for rack %q: configure a selector or the rack's defaultImage", m.Rack)
		return d
	}
	d.Action, d.ImageID, d.Reason = BootImage, img, "state "+string(m.State)
	return d
}

// Labels returns the selector labels of m: its inventory labels plus rack, slot, sku,
// mac, serial, id and node.
func Labels(m *inventory.Machine) policy.Labels {
	l := policy.Labels{}
	for k, v := range m.Labels {
		l[k] = v
	}
	l[policy.LabelRack], l[policy.LabelSlot] = m.Rack, m.Slot
	l[policy.LabelMAC], l[policy.LabelSerial], l[policy.LabelID], l[policy.LabelNode] = m.Identity.MAC, m.Identity.Serial, m.ID, m.NodeName
	var f machinev1.MachineFacts
	if proto.Unmarshal(m.Facts, &f) == nil {
		var products []string
		for _, g := range f.GetGpus() {
			products = append(products, g.GetProductName())
		}
		if sku := policy.SKU(products); sku != "" {
			l[policy.LabelSKU] = sku
		}
	}
	return l
}

// ImageFor returns the image m boots and the selector that chose it ("" for the
// rack's default image or a rollout's pin).
func (s *Service) ImageFor(m *inventory.Machine) (image, selector string) {
	c := s.ImageChoice(m)
	if c.Source == SourceSelector {
		return c.Image, c.Name
	}
	return c.Image, ""
}

func (s *Service) imageAndProfile(m *inventory.Machine) (string, string) {
	return imageAndProfile(s.cfg.Selectors, s.cfg.Racks, m)
}

// imageAndProfile returns the image m boots and the profile it was built from (see
// imageChoice).
func imageAndProfile(selectors []policy.Selector, racks map[string]Rack, m *inventory.Machine) (string, string) {
	c := imageChoice(selectors, racks, m)
	return c.Image, c.Profile
}

// Where an ImageChoice comes from.
const (
	SourceRollout     = "rollout"
	SourceSelector    = "selector"
	SourceRackDefault = "rack default"
)

// ImageChoice is the image a machine gets at its next boot, and why.
type ImageChoice struct {
	// Image is the image id; empty when nothing gives one (the machine is held).
	Image string
	// Profile is the selector's profile, for display; empty otherwise.
	Profile string
	// Source is SourceRollout, SourceSelector or SourceRackDefault; Name is the
	// rollout's id, the selector's name or the rack.
	Source, Name string
	// Why is a sentence; Lost names the selectors that matched and lost, and why.
	Why  string
	Lost []string
}

// ImageChoice is the image m gets at its next boot and why (`gpuboot machines show`).
func (s *Service) ImageChoice(m *inventory.Machine) ImageChoice {
	return imageChoice(s.cfg.Selectors, s.cfg.Racks, m)
}

// imageChoice decides m's image: a rollout's pin first, then the selectors in
// policy.Explain's precedence, then the rack's default image (decision 0687).
func imageChoice(selectors []policy.Selector, racks map[string]Rack, m *inventory.Machine) ImageChoice {
	e := policy.Explain(selectors, Labels(m))
	var c ImageChoice
	switch {
	case m.ImagePin != nil:
		c = ImageChoice{Image: m.ImagePin.Image, Source: SourceRollout, Name: m.ImagePin.Rollout,
			Why: fmt.Sprintf("pinned by rollout %s since %s; a pin wins over every selector until the rollout releases it",
				m.ImagePin.Rollout, m.ImagePin.Since.UTC().Format(time.RFC3339))}
		if e.Matched {
			c.Lost = append([]string{fmt.Sprintf("%s, and loses to the pin", e.Why)}, e.Lost...)
		}
	case e.Matched:
		c = ImageChoice{Image: e.Selector.Image, Profile: e.Selector.Profile, Source: SourceSelector, Name: e.Selector.Name, Why: e.Why, Lost: e.Lost}
	default:
		c = ImageChoice{Image: racks[m.Rack].DefaultImage, Source: SourceRackDefault, Name: m.Rack,
			Why: fmt.Sprintf("no selector matches: rack %q's defaultImage", m.Rack)}
		if c.Image == "" {
			c.Why = fmt.Sprintf("no selector matches and rack %q has no defaultImage: the machine is held at boot", m.Rack)
		}
	}
	return c
}

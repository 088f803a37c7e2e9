package enroll

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/machineops"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// Errors of the operator operations (pxe/machineops); pxe/admin maps them to gRPC codes.
var (
	ErrPrecondition = machineops.ErrPrecondition
	ErrInvalid      = machineops.ErrInvalid
	ErrAmbiguous    = machineops.ErrAmbiguous
)

// Resolve finds the machine a MachineRef names: its id, node name or boot MAC.
func (s *Service) Resolve(ctx context.Context, ref string) (*inventory.Machine, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("%w: empty machine reference: give an id, node name or boot MAC", ErrInvalid)
	}
	if m, err := s.store.Get(ctx, ref); err == nil {
		return m, nil
	}
	all, err := s.store.List(ctx)
	if err != nil {
		return nil, err
	}
	lref := strings.ToLower(ref)
	var hits []*inventory.Machine
	for _, m := range all {
		if (m.NodeName != "" && m.NodeName == lref) || m.Identity.MAC == lref {
			hits = append(hits, m)
		}
	}
	switch len(hits) {
	case 0:
		return nil, fmt.Errorf("machine %q: %w", ref, inventory.ErrNotFound)
	case 1:
		return hits[0], nil
	}
	ids := make([]string, len(hits))
	for i, m := range hits {
		ids[i] = m.ID
	}
	sort.Strings(ids)
	return nil, fmt.Errorf("%w: %q matches machines %s; use an id", ErrAmbiguous, ref, strings.Join(ids, ", "))
}

// ApproveOptions are an operator's approval details (pxe/machineops).
type ApproveOptions = machineops.ApproveOptions

// Approve lets a machine join (CONTRACTS §2.4): registered → approved binding the live
// registration's key; discovered → approved (pre-approval: the first key that
// registers is bound); rejected → approved; joining → approved, for an agent whose
// JoinBundle answer was lost after the release was recorded (its Register answers
// BUNDLE_RELEASED, decision 0704): the live key may fetch a new bundle, with a new token.
func (s *Service) Approve(ctx context.Context, ref string, o ApproveOptions) (*inventory.Machine, error) {
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	if o.Reason == "" {
		o.Reason = "approved by an operator"
	}
	if o.NodeName != "" {
		if n := nodeName(o.NodeName); n != o.NodeName {
			return nil, fmt.Errorf("%w: node name %q is not a valid Kubernetes node name (lowercase letters, digits and '-')", ErrInvalid, o.NodeName)
		}
		holders, err := s.store.ByNodeName(ctx, o.NodeName)
		if err != nil {
			return nil, err
		}
		for _, other := range holders {
			if other.ID != m.ID && other.State != inventory.Decommissioned {
				return nil, fmt.Errorf("%w: node name %q is used by machine %s", ErrInvalid, o.NodeName, other.ID)
			}
		}
	}
	now := s.cfg.Now()
	return s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		switch m.State {
		case inventory.Discovered, inventory.Registered, inventory.Rejected:
		case inventory.Joining:
			for i := range m.Keys {
				m.Keys[i].BundleReleased = false
			}
		default:
			hint := ""
			if m.State == inventory.Decommissioned {
				hint = " (a decommissioned machine that boots again starts over as discovered: approve it then)"
			}
			return nil, fmt.Errorf("%w: machine %s is %s; approve works on discovered, registered, rejected or joining machines%s", ErrPrecondition, m.ID, m.State, hint)
		}
		var live []inventory.Key
		for _, k := range m.Keys {
			if k.Live(now) {
				live = append(live, k)
			}
		}
		if len(live) > 1 {
			return nil, fmt.Errorf("%w: machine %s has %d live keys; resolve that first", ErrPrecondition, m.ID, len(live))
		}
		m.BoundKey, m.Approval = "", nil
		if len(live) == 1 {
			m.BoundKey = live[0].Fingerprint
			m.Keys = live
			if s.cfg.Identity.usesTPM() {
				bindEK(m)
			}
		}
		rearmed := m.AllowlistSpent
		m.AllowlistSpent = false
		if o.NodeName != "" {
			m.NodeName = o.NodeName
		}
		if o.Rack != "" {
			m.Rack = o.Rack
		}
		if o.Slot != "" {
			m.Slot = o.Slot
		}
		m.ImageID, m.Profile = s.imageAndProfile(m)
		reason := o.Reason
		if m.BoundKey != "" {
			reason += fmt.Sprintf(" (key %s)", short(m.BoundKey))
		}
		if rearmed {
			reason += " (allowlist row re-armed)"
		}
		t, err := inventory.Move(m, inventory.Approved, o.Actor, reason, now)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrPrecondition, err)
		}
		return []inventory.Transition{t}, nil
	})
}

// Reject refuses a discovered or registered machine.
func (s *Service) Reject(ctx context.Context, ref, actor, reason string) (*inventory.Machine, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, fmt.Errorf("%w: a reason is required", ErrInvalid)
	}
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State != inventory.Discovered && m.State != inventory.Registered {
			return nil, fmt.Errorf("%w: machine %s is %s; reject works on discovered or registered machines (use decommission for one that joined)", ErrPrecondition, m.ID, m.State)
		}
		m.Approval, m.BoundKey = nil, ""
		t, err := inventory.Move(m, inventory.Rejected, actor, reason, s.cfg.Now())
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
}

// Decommission retires a machine from any state (CONTRACTS §4): its agent certificates
// are revoked, its keys dropped, and its Node and bootstrap tokens deleted.
//
// A machine an approval had bound (or in conflict) also spends its allowlist approval
// (inventory.Machine.AllowlistSpent): its row approves neither it, when it boots again,
// nor another identity on the row, until an operator approves it. And since it held its
// rack's gossip key, a rotation of that key starts (decision 0406), so what the machine
// keeps opens nothing once the rotation is done (rotateAfterDecommission). A rotation
// that cannot start is an error that says what to run; the machine is decommissioned
// anyway.
func (s *Service) Decommission(ctx context.Context, ref, actor, reason string) (*inventory.Machine, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, fmt.Errorf("%w: a reason is required", ErrInvalid)
	}
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	var serials, tokens []string
	var node, rotate string
	m, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State == inventory.Decommissioned {
			return nil, fmt.Errorf("%w: machine %s is already decommissioned", ErrPrecondition, m.ID)
		}
		serials, tokens, node = m.AgentCertSerials, m.BootstrapTokenIDs, m.NodeName
		// Revoke before the record says decommissioned, so no window where a
		// certificate of a decommissioned machine is accepted.
		for _, sn := range serials {
			s.revoke(sn)
		}
		why := reason
		if m.Claimant() {
			m.AllowlistSpent = true
			if _, ok := s.rings.get(m.Rack); ok {
				rotate = m.Rack
				why += fmt.Sprintf(" (rack %s's gossip key, which the machine held, is rotated)", m.Rack)
			}
		}
		if w := m.PendingWipe; w != nil {
			// No agent of the machine calls over mutual TLS any more: nobody takes it.
			why += fmt.Sprintf(" (the pending wipe of %s serial %s is dropped)", w.Path, w.Serial)
			m.PendingWipe = nil
		}
		m.AgentCertSerials, m.Keys, m.BoundKey, m.Approval = nil, nil, "", nil
		t, err := inventory.Move(m, inventory.Decommissioned, actor, why, s.cfg.Now())
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
	if err != nil {
		return nil, err
	}
	var errs []error
	if rotate != "" {
		if st, err := s.rotateAfterDecommission(ctx, rotate); err != nil {
			s.log.Warn("machine decommissioned, but its rack's gossip key could not be rotated: rotate it by hand", "machine", m.ID, "rack", rotate, "error", err)
			errs = append(errs, fmt.Errorf("rack %s's gossip key, which machine %s held, is not rotated (%s): run `gpuboot gossip rotate %s` once `gpuboot gossip status %s` says steady",
				rotate, m.ID, status.Convert(err).Message(), rotate, rotate))
		} else {
			s.log.Info("machine decommissioned: its rack's gossip key is being rotated", "machine", m.ID, "rack", rotate, "phase", protoconv.PhaseWord(st.GetPhase()))
		}
	}
	if s.cfg.Cluster != nil {
		var cerrs []error
		for _, id := range tokens {
			if err := s.cfg.Cluster.DeleteBootstrapToken(ctx, id); err != nil {
				cerrs = append(cerrs, err)
			}
		}
		if node != "" {
			if err := s.cfg.Cluster.DeleteNode(ctx, node); err != nil {
				cerrs = append(cerrs, err)
			}
		}
		if err := errors.Join(cerrs...); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up the cluster failed (retrying `gpuboot machines decommission` is not needed; delete by hand): %w", err))
		} else {
			_, _ = s.store.Update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
				m.BootstrapTokenIDs = nil
				return nil, nil
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return m, fmt.Errorf("machine %s decommissioned and its certificates revoked, but: %w", m.ID, err)
	}
	return m, nil
}

// rotateAfterDecommission starts a rotation of rack's gossip key, which a machine just
// decommissioned held. When a rotation is installing its next key already, the
// machine may have received that key too: a fresh one replaces it, and the agents that
// installed the replaced key take the new ring from their next heartbeat's answer
// (they still encrypt with the primary, so nobody drops out). A rotation that is
// retiring its old key cannot take another step: that is an error.
func (s *Service) rotateAfterDecommission(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error) {
	s.rings.mu.Lock()
	r, ok := s.rings.racks[rack]
	installing := ok && r.ring.Phase() == bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING
	if !installing {
		s.rings.mu.Unlock()
		return s.RotateGossipKey(ctx, rack)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		s.rings.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "new gossip key: %v", err)
	}
	err := s.rings.set(rack, r, GossipRing{Primary: r.ring.Primary, Next: key}, s.cfg.Now())
	s.rings.mu.Unlock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.log.Info("gossip key rotation restarted with a new next key: a decommissioned machine may hold the one being installed", "rack", rack, "next", bootv1.GossipKeyFingerprint(key))
	return s.ringStatus(ctx, rack)
}

// ResolveConflict ends a conflict by choosing the key that keeps the identity.
func (s *Service) ResolveConflict(ctx context.Context, ref, winner, actor, reason string) (*inventory.Machine, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, fmt.Errorf("%w: a reason is required", ErrInvalid)
	}
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	var revoke []string
	m, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State != inventory.Conflict {
			return nil, fmt.Errorf("%w: machine %s is %s, not in conflict", ErrPrecondition, m.ID, m.State)
		}
		i := m.FindKey(winner)
		if i < 0 {
			var fps []string
			for _, k := range m.Keys {
				fps = append(fps, k.Fingerprint)
			}
			return nil, fmt.Errorf("%w: key %q is not registered for machine %s (keys: %s)", ErrInvalid, winner, m.ID, strings.Join(fps, ", "))
		}
		win := m.Keys[i]
		to := m.PreConflict
		if winner != m.BoundKey {
			// The operator's choice moves the EK binding too (decision 0651): to the
			// EK the winner proved, or none.
			m.EKHash, m.EKCertificate = win.EKHash, win.EKCertificate
			// The newer key wins: it gets a new bundle; the old key's certificates go.
			revoke = m.AgentCertSerials
			m.AgentCertSerials = nil
			if m.PreConflict.Bound() {
				to = inventory.Approved
				m.BoundKey = winner
			} else {
				to = inventory.Registered
			}
		}
		if to == inventory.None || !inventory.Allowed(inventory.Conflict, to) {
			to = inventory.Registered
		}
		m.Keys = []inventory.Key{win}
		m.Approval = nil
		t, err := inventory.Move(m, to, actor, fmt.Sprintf("%s (key %s kept)", reason, short(winner)), s.cfg.Now())
		if err != nil {
			return nil, err
		}
		m.PreConflict = ""
		return []inventory.Transition{t}, nil
	})
	for _, sn := range revoke {
		s.revoke(sn)
	}
	return m, err
}

// NodeRegistered is called by the node controller when the Node named nodeName
// exists, with the boot id its kubelet reports (status.nodeInfo.bootID): a joining
// machine moves to commissioning, its bootstrap tokens are deleted, and a commissioning
// report that arrived early is applied (CONTRACTS §2.7, §4). It finds the machine
// through the inventory's node name index, so the node controller may call it on every
// reconcile.
//
// A machine that rejoins after a reboot finds its Node still there, registered by the
// kubelet of the boot before: that Node is not this join's, and deleting the tokens then
// would leave the new kubelet's TLS bootstrap Unauthorized for good. So the move waits
// until the Node reports the boot id the bound key registered with (the kubelet of this
// boot has updated it); a key that registered without a boot id is not held back.
//
// An early report that cannot be applied is an error, and the machine stays joining
// with the report kept: it is never dropped.
func (s *Service) NodeRegistered(ctx context.Context, nodeName, nodeBootID string) (*inventory.Machine, error) {
	holders, err := s.store.ByNodeName(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	var m *inventory.Machine
	for _, c := range holders {
		if c.State == inventory.Joining {
			m = c
		}
	}
	if m == nil {
		return nil, nil
	}
	if want := m.BoundBootID(); want != "" && want != nodeBootID {
		s.log.Info("Node exists but was registered by another boot; waiting for this boot's kubelet", "node", nodeName, "node_boot_id", nodeBootID, "machine_boot_id", want)
		return m, nil
	}
	tokens := m.BootstrapTokenIDs
	if s.cfg.Cluster != nil {
		for _, id := range tokens {
			if err := s.cfg.Cluster.DeleteBootstrapToken(ctx, id); err != nil {
				s.log.Warn("delete bootstrap token", "node", nodeName, "token", id, "err", err)
			}
		}
	}
	now := s.cfg.Now()
	return s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State != inventory.Joining {
			return nil, nil
		}
		m.BootstrapTokenIDs = nil
		t, err := inventory.Move(m, inventory.Commissioning, "gpuboot", fmt.Sprintf("Node %s registered", nodeName), now)
		if err != nil {
			return nil, err
		}
		ts := []inventory.Transition{t}
		if len(m.CommissioningReport) > 0 {
			cl, err := decodeChecklist(m.CommissioningReport)
			if err != nil {
				return nil, fmt.Errorf("machine %s: the commissioning report received while joining does not decode (%v); it stays stored and the machine joining: check the inventory file", m.ID, err)
			}
			to, reason := commissioningMove(cl, s.cfg.AllowSimulated)
			t2, err := inventory.Move(m, to, "gpuboot", reason+" (report received before the Node registered)", now)
			if err != nil {
				return nil, fmt.Errorf("apply the commissioning report received while joining: %w", err)
			}
			ts = append(ts, t2)
			m.CommissioningReport = nil
		}
		return ts, nil
	})
}

// Revoked reports whether the agent certificate serial is revoked.
func (s *Service) Revoked(serial *big.Int) bool { return s.cfg.Revocations.Contains(serial) }

// RevokeSerials puts certificate serials (hex) on gpuboot's revocation list and saves
// it; it returns the serials that parsed. For certificates that are not an agent's
// (operators'), whose holders the inventory does not know.
func (s *Service) RevokeSerials(serials []string) ([]string, error) {
	var done []string
	for _, sn := range serials {
		n, ok := new(big.Int).SetString(strings.TrimPrefix(strings.ToLower(sn), "0x"), 16)
		if !ok || n.Sign() <= 0 {
			return done, fmt.Errorf("%w: certificate serial %q is not a positive hex number", ErrInvalid, sn)
		}
		s.revoke(n.Text(16))
		done = append(done, n.Text(16))
	}
	return done, nil
}

// StateByNode returns the state of the machine holding nodeName (not decommissioned).
// It reads the inventory's node name index.
func (s *Service) StateByNode(ctx context.Context, nodeName string) (inventory.State, bool, error) {
	holders, err := s.store.ByNodeName(ctx, nodeName)
	if err != nil {
		return inventory.None, false, err
	}
	for _, m := range holders {
		if m.State != inventory.Decommissioned {
			return m.State, true, nil
		}
	}
	return inventory.None, false, nil
}

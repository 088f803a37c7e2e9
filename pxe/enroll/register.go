package enroll

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// IdentityFromProto normalises a MachineIdentity (CONTRACTS §1) into the inventory
// form. The boot MAC is required.
func IdentityFromProto(p *machinev1.MachineIdentity) (inventory.Identity, error) {
	if p == nil {
		return inventory.Identity{}, errors.New("identity is missing")
	}
	id, err := identity.New(p.GetBootMac(), p.GetSmbiosUuid(), p.GetSerial())
	if err != nil {
		return inventory.Identity{}, fmt.Errorf("identity: %w", err)
	}
	return FromIdentity(id), nil
}

// FromIdentity converts a pxe/identity Identity into the inventory form.
func FromIdentity(id identity.Identity) inventory.Identity {
	return inventory.Identity{MAC: id.MACString(), UUID: id.UUID, Serial: id.Serial}
}

// IdentityProto converts back.
func IdentityProto(id inventory.Identity) *machinev1.MachineIdentity {
	return &machinev1.MachineIdentity{BootMac: id.MAC, SmbiosUuid: id.UUID, Serial: id.Serial}
}

func agentActor(fp string) string { return "agent:" + fp }

func remoteOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// Register implements EnrollmentService.Register (CONTRACTS §2.3, §2.8).
func (s *Service) Register(ctx context.Context, req *bootv1.RegisterRequest) (*bootv1.RegisterResponse, error) {
	now := s.cfg.Now()
	pub, err := bootv1.VerifyRequest(bootv1.EnrollmentService_Register_FullMethodName, req, now)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if !ed25519.PublicKey(req.GetPublicKey()).Equal(pub) {
		return nil, status.Error(codes.InvalidArgument, "register: public_key differs from auth.public_key: sign with the key being registered")
	}
	id, err := IdentityFromProto(req.GetFacts().GetIdentity())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: facts.%v", err)
	}
	if cl := req.GetChecklist(); cl != nil && cl.GetIdentity() != nil {
		if cid, err := IdentityFromProto(cl.GetIdentity()); err != nil || cid != id {
			return nil, status.Error(codes.InvalidArgument, "register: checklist.identity differs from facts.identity")
		}
	}
	fp := bootv1.KeyFingerprint(pub)
	key := inventory.Key{
		Fingerprint: fp, PublicKey: append([]byte(nil), pub...), RegisteredAt: now.UTC(), LastSeen: now.UTC(),
		BootID: req.GetFacts().GetBootId(), Remote: remoteOf(ctx),
	}
	facts, _ := proto.Marshal(req.GetFacts())
	var checklist []byte
	if req.GetChecklist() != nil {
		checklist, _ = proto.Marshal(req.GetChecklist())
	}

	m, err := s.store.Lookup(ctx, id.Key())
	if errors.Is(err, inventory.ErrNotFound) {
		m, err = s.createRegistered(ctx, id, key, facts, checklist, now)
		if errors.Is(err, inventory.ErrExists) {
			m, err = s.store.Lookup(ctx, id.Key())
		}
	}
	if err != nil {
		if errors.Is(err, ErrLimited) {
			s.count("limited")
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
	}
	var resp *bootv1.RegisterResponse
	var revoke []string
	m, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		before := m.AgentCertSerials
		var ts []inventory.Transition
		resp, ts = s.register(m, key, facts, checklist, now)
		if len(m.AgentCertSerials) < len(before) {
			revoke = before
		}
		return ts, nil
	})
	if err != nil {
		return nil, status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
	}
	// A re-enrollment retired the old key: its certificates go with it.
	for _, sn := range revoke {
		s.revoke(sn)
	}
	resp.MachineState = StateProto(m.State)
	s.count(strings.ToLower(strings.TrimPrefix(resp.Status.String(), "REGISTER_STATUS_")))
	return resp, nil
}

func (s *Service) count(answer string) {
	s.stats.mu.Lock()
	s.stats.Registrations[answer]++
	s.stats.mu.Unlock()
}

// createRegistered records an identity first seen through Register.
func (s *Service) createRegistered(ctx context.Context, id inventory.Identity, key inventory.Key, facts, checklist []byte, now time.Time) (*inventory.Machine, error) {
	// Key and facts go into the same transaction as the record, so a crash never
	// leaves a registered machine without the key that registered it.
	m := &inventory.Machine{ID: inventory.NewID(), Identity: id, CreatedAt: now.UTC(), Rack: s.cfg.DefaultRack,
		Keys: []inventory.Key{key}, Facts: facts, Checklist: checklist}
	d := s.cfg.Policy.Decide(candidate(id))
	if d.Rack != "" {
		m.Rack = d.Rack
	}
	m.Slot = d.Slot
	m.ImageID, m.Profile = s.imageAndProfile(m)
	t, err := inventory.Move(m, inventory.Registered, agentActor(key.Fingerprint), "agent registered an identity gpuboot had not seen", now)
	if err != nil {
		return nil, err
	}
	if err := s.create(ctx, m, t); err != nil {
		return nil, err
	}
	return m, nil
}

func candidate(id inventory.Identity) policy.Candidate {
	return policy.Candidate{MAC: id.MAC, UUID: id.UUID, Serial: id.Serial}
}

// register is the pure part of Register: what one call with key does to m.
func (s *Service) register(m *inventory.Machine, key inventory.Key, facts, checklist []byte, now time.Time) (*bootv1.RegisterResponse, []inventory.Transition) {
	var ts []inventory.Transition
	move := func(to inventory.State, actor, reason string) {
		t, err := inventory.Move(m, to, actor, reason, now)
		if err != nil {
			// The callers below only ask for moves the table allows; an error here
			// is a bug, logged, and the state stays as it was.
			s.log.Error("lifecycle", "err", err)
			return
		}
		ts = append(ts, t)
	}
	fp := key.Fingerprint
	switch m.State {
	case inventory.Decommissioned:
		return &bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_DECOMMISSIONED,
			Message: "this machine was decommissioned; reboot it to start over"}, nil
	case inventory.Rejected:
		return &bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_REJECTED,
			Message: "an operator rejected this machine"}, nil
	}

	if i := m.FindKey(fp); i >= 0 {
		k := &m.Keys[i]
		k.LastSeen, k.Remote = now.UTC(), key.Remote
		if key.BootID != "" {
			k.BootID = key.BootID
		}
	} else {
		var live []inventory.Key
		for _, k := range m.Keys {
			if k.Live(now) {
				live = append(live, k)
			}
		}
		if len(live) >= 2 {
			// Two live keys already; a third is not stored (bounded growth).
			return &bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING,
				Message: "two other keys for this identity are live; an operator must resolve it", RetryAfter: durationpb.New(DefaultPollEvery)}, ts
		}
		// Dead keys are dropped; a live one stays beside the new key. The machine
		// may have rebooted without its boot request reaching gpuboot, or another
		// machine claims its identity: if both stay live it is a conflict
		// (checkConflict); if the old one goes away the new one takes over below.
		if m.State == inventory.Conflict {
			m.Keys = append(m.Keys, key)
		} else {
			m.Keys = append(live, key)
		}
	}
	othersLive := false
	for _, k := range m.Keys {
		othersLive = othersLive || (k.Fingerprint != fp && k.Live(now))
	}
	if !othersLive && m.BoundKey != fp && m.State != inventory.Conflict {
		old := m.BoundKey
		m.Keys = []inventory.Key{m.Keys[m.FindKey(fp)]}
		switch {
		case old != "":
			// Re-enrollment (CONTRACTS §2.8): the bound key is gone, and with it the
			// certificates issued to it (revoked by the caller).
			m.Approval = nil
			m.AgentCertSerials = nil
			if s.cfg.Reenroll == ReenrollAuto {
				m.BoundKey = fp
				move(inventory.Approved, "policy:reenroll-auto", fmt.Sprintf("new key %s after reboot; bound key %s no longer live", short(fp), short(old)))
			} else {
				m.BoundKey = ""
				move(inventory.Registered, "policy:reenroll-manual", fmt.Sprintf("new key %s after reboot; bound key %s no longer live; waiting for an operator", short(fp), short(old)))
			}
		case m.State == inventory.Approved:
			// Approved ahead of its agent (hold mode, allowlist): bind the first key.
			m.BoundKey = fp
			move(inventory.Approved, agentActor(fp), "first key registered for a pre-approved identity is bound")
		case m.State == inventory.Discovered:
			move(inventory.Registered, agentActor(fp), "agent registered")
		}
	}
	if t, ok := s.checkConflict(m, now); ok {
		ts = append(ts, t)
	}
	current := m.BoundKey == fp || (m.BoundKey == "" && len(m.Keys) == 1 && m.Keys[0].Fingerprint == fp)
	if current {
		m.Facts = facts
		if checklist != nil {
			m.Checklist = checklist
		}
		// Facts give the sku label selectors may match on.
		m.ImageID, m.Profile = s.imageAndProfile(m)
	}
	if m.State == inventory.Registered && current && len(m.Keys) == 1 {
		if d := s.cfg.Policy.Decide(candidate(m.Identity)); d.Approve {
			if d.Rack != "" {
				m.Rack, m.Slot = d.Rack, d.Slot
			}
			m.BoundKey = fp
			m.ImageID, m.Profile = s.imageAndProfile(m)
			move(inventory.Approved, d.Actor, d.Reason)
		}
	}
	resp := &bootv1.RegisterResponse{}
	switch {
	case m.State == inventory.Conflict:
		resp.Status = bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT
		resp.Message = "two live keys claim this identity; an operator must resolve the conflict (gpuboot machines resolve-conflict)"
		resp.RetryAfter = durationpb.New(6 * DefaultPollEvery)
	case m.BoundKey == fp && m.Keys[m.FindKey(fp)].BundleReleased:
		resp.Status = bootv1.RegisterStatus_REGISTER_STATUS_BUNDLE_RELEASED
		resp.Message = "the JoinBundle was already released to this key"
	case m.State == inventory.Approved && m.BoundKey == fp:
		if a := m.Approval; a == nil || a.Used || !now.Before(a.ExpiresAt) || a.KeyFingerprint != fp {
			m.Approval = &inventory.Approval{
				Token:          m.ID + "." + base64.RawURLEncoding.EncodeToString(randomBytes(24)),
				Challenge:      randomBytes(bootv1.ChallengeSize),
				KeyFingerprint: fp,
				IssuedAt:       now.UTC(),
				ExpiresAt:      now.UTC().Add(s.cfg.TokenTTL),
			}
		}
		resp.Status = bootv1.RegisterStatus_REGISTER_STATUS_APPROVED
		resp.Token = m.Approval.Token
		resp.Challenge = append([]byte(nil), m.Approval.Challenge...)
		resp.Ttl = durationpb.New(m.Approval.ExpiresAt.Sub(now))
		resp.Message = "approved: call GetJoinBundle within the ttl"
	default:
		resp.Status = bootv1.RegisterStatus_REGISTER_STATUS_PENDING
		resp.RetryAfter = durationpb.New(DefaultPollEvery)
		switch {
		case m.BoundKey != "" && m.BoundKey != fp:
			resp.Message = fmt.Sprintf("another key (%s) is bound to this identity and still live; waiting for it to go away", short(m.BoundKey))
		case len(m.Keys) > 1 && !current:
			resp.Message = "another key for this identity is live; waiting for it to go away"
		default:
			resp.Message = "waiting for approval"
		}
	}
	return resp, ts
}

// checkConflict moves m to conflict when two of its keys are live and both were seen
// after the newer one registered (CONTRACTS §2.8).
func (s *Service) checkConflict(m *inventory.Machine, now time.Time) (inventory.Transition, bool) {
	if len(m.Keys) < 2 || m.State == inventory.Conflict || !inventory.Allowed(m.State, inventory.Conflict) {
		return inventory.Transition{}, false
	}
	newer := 0
	for i, k := range m.Keys {
		if k.RegisteredAt.After(m.Keys[newer].RegisteredAt) {
			newer = i
		}
	}
	n := m.Keys[newer]
	if !n.Live(now) || !n.LastSeen.After(n.RegisteredAt) {
		return inventory.Transition{}, false
	}
	for i, k := range m.Keys {
		if i != newer && k.Live(now) && k.LastSeen.After(n.RegisteredAt) {
			t, err := inventory.Move(m, inventory.Conflict, "gpuboot",
				fmt.Sprintf("keys %s and %s both live after %s registered", short(k.Fingerprint), short(n.Fingerprint), short(n.Fingerprint)), now)
			if err != nil {
				s.log.Error("lifecycle", "err", err)
				return inventory.Transition{}, false
			}
			m.Approval = nil
			return t, true
		}
	}
	return inventory.Transition{}, false
}

// short abbreviates a key fingerprint for messages.
func short(fp string) string {
	if len(fp) > 19 {
		return fp[:19]
	}
	return fp
}

// StateProto converts a lifecycle state to its protobuf enum.
func StateProto(s inventory.State) bootv1.MachineState {
	if v, ok := bootv1.MachineState_value["MACHINE_STATE_"+strings.ToUpper(string(s))]; ok {
		return bootv1.MachineState(v)
	}
	return bootv1.MachineState_MACHINE_STATE_UNSPECIFIED
}

// StateFromProto converts back; UNSPECIFIED is None.
func StateFromProto(s bootv1.MachineState) inventory.State {
	if s == bootv1.MachineState_MACHINE_STATE_UNSPECIFIED {
		return inventory.None
	}
	return inventory.State(strings.ToLower(strings.TrimPrefix(s.String(), "MACHINE_STATE_")))
}

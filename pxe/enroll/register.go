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
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

func agentActor(fp string) string { return "agent:" + fp }

func remoteOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// Register implements EnrollmentService.Register (CONTRACTS §2.3, §2.8). It
// authenticates the call, draws what the decision needs (the policy's verdict for the
// identity, the randomness of a new approval, the time), lets decideRegister decide and
// stores what it returns.
func (s *Service) Register(ctx context.Context, req *bootv1.RegisterRequest) (*bootv1.RegisterResponse, error) {
	id, call, challenge, err := s.readRegister(ctx, req)
	if err != nil || challenge != nil {
		return challenge, err
	}
	fp := call.Key.Fingerprint
	if err := s.checkManifestEK(ctx, id, &call); err != nil {
		return nil, err
	}

	m, err := s.store.Lookup(ctx, id.Key())
	if errors.Is(err, inventory.ErrNotFound) {
		m, err = s.createRegistered(ctx, id, call)
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
	if call.Verdict.ByAllowlist() && (m.State == inventory.Discovered || m.State == inventory.Registered) {
		// One allowlist row approves one machine: held across the check and the
		// update, so two identities on one row are never both approved.
		s.rowMu.Lock()
		defer s.rowMu.Unlock()
		holder, err := s.rowHolder(ctx, id, call.Verdict)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
		}
		if holder != "" {
			call.Verdict.Approve, call.RowHeldBy = false, holder
			s.log.Warn("allowlist row already bound to another machine: not approved", "machine", m.ID, "mac", id.MAC, "serial", id.Serial,
				"uuid", id.UUID, "manifest", call.Verdict.Source, "row", call.Verdict.Line, "boundTo", holder, "key", fp, "remote", call.Key.Remote)
		}
	}
	var d registerDecision
	m, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		var err error
		if d, err = decideRegister(m, call, s.registerRules()); err != nil {
			return nil, err
		}
		*m = *d.Machine
		return d.Transitions, nil
	})
	if errors.Is(err, ErrLimited) {
		s.count("limited")
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
	}
	// A re-enrollment retired the old key: its certificates go with it.
	for _, sn := range d.Revoke {
		s.revoke(sn)
	}
	if m.BoundKey != "" && m.BoundKey != fp {
		// Another key is bound and live: a rebooted machine waiting for its old key
		// to time out, or someone claiming this identity. It is recorded (the keys
		// of `gpuboot machines show`) and changes nothing else.
		s.log.Warn("a key that is not bound registered for a bound identity; it waits until the bound key stops calling or an operator acts",
			"machine", m.ID, "state", m.State, "key", fp, "bound", m.BoundKey, "remote", call.Key.Remote)
	}
	resp := d.Response
	resp.MachineState = protoconv.StateProto(m.State)
	s.count(strings.ToLower(strings.TrimPrefix(resp.Status.String(), "REGISTER_STATUS_")))
	return resp, nil
}

// readRegister authenticates a Register call and draws what decideRegister needs: the
// identity, the calling key as it would be stored, the policy's verdict, the time and
// the randomness of a new approval. A response instead is the TPM challenge the key
// must answer first (decision 0650).
func (s *Service) readRegister(ctx context.Context, req *bootv1.RegisterRequest) (identity.Identity, registerCall, *bootv1.RegisterResponse, error) {
	if err := checkRegisterLimits(req); err != nil {
		return identity.Identity{}, registerCall{}, nil, err
	}
	now := s.cfg.Now()
	pub, err := bootv1.VerifyRequest(bootv1.EnrollmentService_Register_FullMethodName, req, now)
	if err != nil {
		return identity.Identity{}, registerCall{}, nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if !ed25519.PublicKey(req.GetPublicKey()).Equal(pub) {
		return identity.Identity{}, registerCall{}, nil, status.Error(codes.InvalidArgument, "register: public_key differs from auth.public_key: sign with the key being registered")
	}
	id, err := protoconv.IdentityFromProto(req.GetFacts().GetIdentity())
	if err != nil {
		return identity.Identity{}, registerCall{}, nil, status.Errorf(codes.InvalidArgument, "register: facts.%v", err)
	}
	if cl := req.GetChecklist(); cl != nil && cl.GetIdentity() != nil {
		if cid, err := protoconv.IdentityFromProto(cl.GetIdentity()); err != nil || cid != id {
			return identity.Identity{}, registerCall{}, nil, status.Error(codes.InvalidArgument, "register: checklist.identity differs from facts.identity")
		}
	}
	fp := bootv1.KeyFingerprint(pub)
	// TPM-bound identity (decision 0650): a key proves its EK before anything is
	// stored for it.
	ek, ekCert, challenge, err := s.proveTPM(ctx, id, fp, req.GetTpm(), now)
	if err != nil || challenge != nil {
		return id, registerCall{}, challenge, err
	}
	call := registerCall{
		Key: inventory.Key{
			Fingerprint: fp, PublicKey: append([]byte(nil), pub...), RegisteredAt: now.UTC(), LastSeen: now.UTC(),
			BootID: req.GetFacts().GetBootId(), Remote: remoteOf(ctx), EKHash: ek, EKCertificate: ekCert,
		},
		Verdict:     s.cfg.Policy.Decide(id),
		Now:         now,
		TokenSecret: randomBytes(tokenSecretSize),
		Challenge:   randomBytes(bootv1.ChallengeSize),
	}
	// Deterministic, so the same facts encode the same and an unchanged Register
	// writes nothing.
	enc := proto.MarshalOptions{Deterministic: true}
	call.Facts, _ = enc.Marshal(req.GetFacts())
	if req.GetChecklist() != nil {
		call.Checklist, _ = enc.Marshal(req.GetChecklist())
	}
	return id, call, nil, nil
}

func (s *Service) count(answer string) {
	s.stats.mu.Lock()
	s.stats.Registrations[answer]++
	s.stats.mu.Unlock()
}

// createRegistered records an identity first seen through Register.
func (s *Service) createRegistered(ctx context.Context, id identity.Identity, call registerCall) (*inventory.Machine, error) {
	// Key and facts go into the same transaction as the record, so a crash never
	// leaves a registered machine without the key that registered it.
	now := call.Now
	m := &inventory.Machine{ID: inventory.NewID(), Identity: id, CreatedAt: now.UTC(), Rack: s.cfg.DefaultRack,
		Keys: []inventory.Key{call.Key}, Facts: call.Facts, Checklist: call.Checklist}
	if call.Verdict.Rack != "" {
		m.Rack = call.Verdict.Rack
	}
	m.Slot, m.BMC = call.Verdict.Slot, call.Verdict.BMC
	m.ImageID, m.Profile = s.imageAndProfile(m)
	t, err := inventory.Move(m, inventory.Registered, agentActor(call.Key.Fingerprint), "agent registered an identity gpuboot had not seen", now)
	if err != nil {
		return nil, err
	}
	if err := s.create(ctx, m, t); err != nil {
		return nil, err
	}
	return m, nil
}

// checkManifestEK applies the TPM EK the rack manifest names for id (policy
// Decision.EKHash) to a Register call: only a key that proved that EK may claim an
// identity not bound yet (issue 33). Any other key is refused with PermissionDenied and
// nothing is stored, so a stranger who knows a listed serial and MAC, even one who
// registers before the machine first boots, neither takes the row nor holds the
// machine in conflict. An identity already bound (to a key or an EK) is left to ekStep
// and the key rules, as before: there another key is a conflict an operator sees.
//
// Under `identity: mac-uuid-serial` no key proves an EK, so such a row approves
// nothing: the call goes on with the approval taken out, and the machine waits for an
// operator (gpuboot serve warns at start).
func (s *Service) checkManifestEK(ctx context.Context, id identity.Identity, call *registerCall) error {
	want := call.Verdict.EKHash
	if want == "" || call.Key.EKHash == want {
		return nil
	}
	if !s.cfg.Identity.usesTPM() {
		call.Verdict.Approve = false
		return nil
	}
	m, err := s.store.Lookup(ctx, id.Key())
	switch {
	case err == nil && (m.EKHash != "" || m.BoundKey != ""):
		return nil
	case err != nil && !errors.Is(err, inventory.ErrNotFound):
		return status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
	}
	claimed := call.Key.EKHash
	if claimed == "" {
		claimed = "none"
	}
	s.count("ek-refused")
	s.log.Warn("refused: the rack manifest names another TPM for this serial and MAC", "mac", id.MAC, "serial", id.Serial, "uuid", id.UUID,
		"manifest", call.Verdict.Source, "row", call.Verdict.Line, "manifestEK", want, "provedEK", claimed, "key", call.Key.Fingerprint, "remote", call.Key.Remote)
	return status.Errorf(codes.PermissionDenied,
		"register: the rack manifest (%s line %d) names TPM EK %s for this machine and this agent proved EK %s: if this is the machine, correct its row in the manifest (ekHash or ekCertificate)",
		call.Verdict.Source, call.Verdict.Line, want, claimed)
}

// tokenSecretSize is the number of random bytes in a JoinBundle token after the
// machine id.
const tokenSecretSize = 24

// registerCall is one Register call as decideRegister sees it: everything that is
// read, drawn or decided elsewhere is an input, so the decision is a function of it.
type registerCall struct {
	// Key is the calling key as it would be stored now (RegisteredAt = LastSeen = Now).
	Key inventory.Key
	// Facts and Checklist are the call's MachineFacts and Checklist, encoded; Checklist
	// is nil when the call carried none.
	Facts, Checklist []byte
	// Verdict is the approval policy's decision for the machine's identity.
	Verdict policy.Decision
	Now     time.Time
	// TokenSecret (tokenSecretSize bytes) and Challenge (bootv1.ChallengeSize bytes)
	// are random; they make a new approval when one is needed and are unused otherwise.
	TokenSecret, Challenge []byte
	// RowHeldBy is the id of the machine the allowlist row of Verdict is bound to,
	// when that is another machine (Verdict.Approve is then false); empty otherwise.
	RowHeldBy string
}

// rowHolder returns the id of another machine the allowlist row that d matched is
// bound to: one, other than id's, whose identity matches the same row and which claims
// it (inventory.Machine.Claimant: an approval bound it, it is in conflict, or it was
// decommissioned and its allowlist approval is spent). One row approves at most one
// machine (issue 14): a listed serial and MAC with another UUID is a second identity
// and waits for an operator.
//
// Unapproved callers reach it, so it reads the store's claims index by the row's MAC
// (or serial): the cost is the claimants of that MAC, not the inventory.
func (s *Service) rowHolder(ctx context.Context, id identity.Identity, d policy.Decision) (string, error) {
	if !d.ByAllowlist() || s.cfg.Policy.List == nil {
		return "", nil
	}
	mac, serial := id.MAC, ""
	if !d.RowHasMAC {
		mac, serial = "", id.Serial
	}
	claims, err := s.store.Claimants(ctx, mac, serial)
	if err != nil {
		return "", err
	}
	for _, c := range claims {
		if c.Identity == id {
			continue
		}
		if e, ok := s.cfg.Policy.List.Match(c.Identity); ok && d.MatchedRow(e) {
			return c.ID, nil
		}
	}
	return "", nil
}

// lastSeenStep is how stale the stored LastSeen of a machine's only key may get before
// a Register from it writes a new one: polls in between change nothing, so they write
// nothing, and a polling key stays live (inventory.KeyLiveness is six steps).
const lastSeenStep = inventory.KeyLiveness / 6

// registerRules are the settings decideRegister applies.
type registerRules struct {
	Identity  IdentityMode
	Reenroll  Reenroll
	TokenTTL  time.Duration
	Selectors []policy.Selector
	Racks     map[string]Rack
}

func (s *Service) registerRules() registerRules {
	return registerRules{Identity: s.cfg.Identity, Reenroll: s.cfg.Reenroll, TokenTTL: s.cfg.TokenTTL, Selectors: s.cfg.Selectors, Racks: s.cfg.Racks}
}

// registerDecision is what one Register call does to a machine.
type registerDecision struct {
	// Machine is the record to store (a copy; the input is not changed).
	Machine *inventory.Machine
	// Transitions are stored with it, in order.
	Transitions []inventory.Transition
	// Response is the answer to the agent; MachineState is set from Machine.State.
	Response *bootv1.RegisterResponse
	// Revoke lists the serials (hex) of agent certificates to revoke: those of a bound
	// key a re-enrollment retired.
	Revoke []string
}

// decideRegister decides what a Register call does to the stored machine m (CONTRACTS
// §2.3, §2.4, §2.8): which keys it keeps, which key an approval binds, the lifecycle
// moves, the one-time token and the answer. It is pure: no I/O, no clock, no
// randomness, no logging. A move the lifecycle table refuses (a record in a state the
// table does not expect) is an error wrapping inventory.ErrIllegalTransition, and
// nothing is to be stored.
func decideRegister(stored *inventory.Machine, call registerCall, rules registerRules) (registerDecision, error) {
	m := stored.Clone()
	now := call.Now
	d := registerDecision{Machine: m}
	var moveErr error
	move := func(to inventory.State, actor, reason string) {
		if moveErr != nil {
			return
		}
		t, err := inventory.Move(m, to, actor, reason, now)
		if err != nil {
			moveErr = fmt.Errorf("register: %w", err)
			return
		}
		d.Transitions = append(d.Transitions, t)
	}
	done := func(resp *bootv1.RegisterResponse) (registerDecision, error) {
		if moveErr != nil {
			return registerDecision{}, moveErr
		}
		resp.MachineState = protoconv.StateProto(m.State)
		d.Response = resp
		return d, nil
	}
	fp := call.Key.Fingerprint
	switch m.State {
	case inventory.Decommissioned:
		return done(&bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_DECOMMISSIONED,
			Message: "this machine was decommissioned; reboot it to start over"})
	case inventory.Rejected:
		return done(&bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_REJECTED,
			Message: "an operator rejected this machine"})
	}
	if rules.Identity.usesTPM() {
		if resp := ekStep(m, call, &d, move); resp != nil {
			return done(resp)
		}
	}
	if resp := keepKey(m, call.Key, now); resp != nil {
		return done(resp)
	}
	bindLoneKey(m, fp, rules.Reenroll, now, &d, move)
	if moveErr == nil {
		t, ok, err := conflictMove(m, now)
		if err != nil {
			return registerDecision{}, fmt.Errorf("register: %w", err)
		}
		if ok {
			d.Transitions = append(d.Transitions, t)
		}
	}
	current := m.BoundKey == fp || (m.BoundKey == "" && len(m.Keys) == 1 && m.Keys[0].Fingerprint == fp)
	if current {
		m.Facts = call.Facts
		if call.Checklist != nil {
			m.Checklist = call.Checklist
		}
		// Facts give the sku label selectors may match on.
		m.ImageID, m.Profile = imageAndProfile(rules.Selectors, rules.Racks, m)
	}
	// A decommissioned machine's allowlist approval is spent until an operator
	// approves it again, and so is a re-enrolling one's under reenroll: manual: its row
	// approves it no more.
	spent := m.AllowlistSpent && call.Verdict.ByAllowlist()
	if m.State == inventory.Registered && current && len(m.Keys) == 1 && !spent {
		if v := call.Verdict; v.Approve {
			if v.Rack != "" {
				m.Rack, m.Slot = v.Rack, v.Slot
			}
			m.BoundKey = fp
			m.ImageID, m.Profile = imageAndProfile(rules.Selectors, rules.Racks, m)
			move(inventory.Approved, v.Actor, v.Reason)
		}
	}
	if rules.Identity.usesTPM() {
		bindEK(m)
	}
	return done(registerAnswer(m, call, rules, current, spent))
}

// keepKey stores the calling key in m: a known key's last sighting (and EK) is
// refreshed; a new key joins the live ones and dead keys are dropped. With two other
// keys live it stores nothing and returns the answer (bounded growth); else nil.
func keepKey(m *inventory.Machine, key inventory.Key, now time.Time) *bootv1.RegisterResponse {
	if i := m.FindKey(key.Fingerprint); i >= 0 {
		k := &m.Keys[i]
		// With another key beside it, liveness decides who keeps the identity
		// (conflictMove): then every call counts.
		if key.EKHash != "" && k.EKHash == "" {
			k.EKHash, k.EKCertificate = key.EKHash, key.EKCertificate
		}
		if now.Sub(k.LastSeen) >= lastSeenStep || len(m.Keys) > 1 || (key.BootID != "" && key.BootID != k.BootID) {
			k.LastSeen, k.Remote = now.UTC(), key.Remote
			if key.BootID != "" {
				k.BootID = key.BootID
			}
		}
		return nil
	}
	var live []inventory.Key
	for _, k := range m.Keys {
		if k.Live(now) {
			live = append(live, k)
		}
	}
	if len(live) >= 2 {
		return &bootv1.RegisterResponse{Status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING,
			Message: "two other keys for this identity are live; an operator must resolve it", RetryAfter: durationpb.New(DefaultPollEvery)}
	}
	// Dead keys are dropped; a live one stays beside the new key. The machine may have
	// rebooted without its boot request reaching gpuboot, or another machine claims
	// its identity: if both stay live it is a conflict (conflictMove); if the old one
	// goes away the new one takes over (bindLoneKey).
	if m.State == inventory.Conflict {
		m.Keys = append(m.Keys, key)
	} else {
		m.Keys = append(live, key)
	}
	return nil
}

// bindLoneKey acts when the calling key fp is the only live one and not yet bound
// (outside conflict): the other keys are dropped, and a re-enrollment (CONTRACTS §2.8:
// the bound key is gone, its certificates are revoked), a pre-approved identity or a
// discovered machine moves on.
func bindLoneKey(m *inventory.Machine, fp string, reenroll Reenroll, now time.Time, d *registerDecision, move func(inventory.State, string, string)) {
	for _, k := range m.Keys {
		if k.Fingerprint != fp && k.Live(now) {
			return
		}
	}
	if m.BoundKey == fp || m.State == inventory.Conflict {
		return
	}
	old := m.BoundKey
	m.Keys = []inventory.Key{m.Keys[m.FindKey(fp)]}
	switch {
	case old != "":
		d.Revoke = m.AgentCertSerials
		m.Approval = nil
		m.AgentCertSerials = nil
		if reenroll == ReenrollAuto {
			m.BoundKey = fp
			move(inventory.Approved, "policy:reenroll-auto", fmt.Sprintf("new key %s after reboot; bound key %s no longer live", short(fp), short(old)))
		} else {
			m.BoundKey = ""
			// The allowlist row approved the machine once: it must not approve the new
			// key in its stead, or reenroll: manual would not wait for the operator
			// (CONTRACTS §2.8; the operator's approval re-arms the row, decision 0407).
			m.AllowlistSpent = true
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

// registerAnswer is the answer to the calling key once m is decided; for an approved,
// bound key it issues the one-time token (a new one when the last is used, expired or
// another key's).
func registerAnswer(m *inventory.Machine, call registerCall, rules registerRules, current, spent bool) *bootv1.RegisterResponse {
	fp, now := call.Key.Fingerprint, call.Now
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
				Token:          m.ID + "." + base64.RawURLEncoding.EncodeToString(call.TokenSecret),
				Challenge:      append([]byte(nil), call.Challenge...),
				KeyFingerprint: fp,
				IssuedAt:       now.UTC(),
				ExpiresAt:      now.UTC().Add(rules.TokenTTL),
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
		resp.Message = pendingMessage(m, call, rules, current, spent)
	}
	return resp
}

// pendingMessage says why a key waits.
func pendingMessage(m *inventory.Machine, call registerCall, rules registerRules, current, spent bool) string {
	fp := call.Key.Fingerprint
	switch {
	case m.BoundKey != "" && m.BoundKey != fp:
		return fmt.Sprintf("another key (%s) is bound to this identity and still live; waiting for it to go away", short(m.BoundKey))
	case len(m.Keys) > 1 && !current:
		return "another key for this identity is live; waiting for it to go away"
	case call.Verdict.EKHash != "" && strings.HasPrefix(call.Verdict.Actor, "policy:allowlist:") && !rules.Identity.usesTPM():
		return "the rack manifest names this machine's TPM EK, which gpuboot does not check with identity: mac-uuid-serial: an operator must approve it, or set enrollment.identity: tpm"
	case spent:
		return "this machine's allowlist row approved it once and approves it no more (it was decommissioned, or it re-enrolls with a new key under reenroll: manual): an operator must approve it (gpuboot machines approve)"
	case call.RowHeldBy != "":
		return fmt.Sprintf("the allowlist row for this serial and MAC is bound to machine %s; an operator must approve or reject this identity", call.RowHeldBy)
	}
	return "waiting for approval"
}

// conflictMove moves m to conflict when two of its keys are live and both were seen
// after the newer one registered (CONTRACTS §2.8), unless the older is the bound key. It is pure; ok is false when m
// stays as it is.
func conflictMove(m *inventory.Machine, now time.Time) (t inventory.Transition, ok bool, err error) {
	if len(m.Keys) < 2 || m.State == inventory.Conflict || !inventory.Allowed(m.State, inventory.Conflict) {
		return inventory.Transition{}, false, nil
	}
	if b := m.FindKey(m.BoundKey); b >= 0 && m.Keys[b].Live(now) {
		// A live bound key is never displaced by another one: anyone can claim the
		// identity with a key of their own (decision 0405). The other key waits
		// until the bound key stops calling, or an operator acts.
		return inventory.Transition{}, false, nil
	}
	newer := 0
	for i, k := range m.Keys {
		if k.RegisteredAt.After(m.Keys[newer].RegisteredAt) {
			newer = i
		}
	}
	n := m.Keys[newer]
	if !n.Live(now) || !n.LastSeen.After(n.RegisteredAt) {
		return inventory.Transition{}, false, nil
	}
	for i, k := range m.Keys {
		if i != newer && k.Live(now) && k.LastSeen.After(n.RegisteredAt) {
			t, err := inventory.Move(m, inventory.Conflict, "gpuboot",
				fmt.Sprintf("keys %s and %s both live after %s registered", short(k.Fingerprint), short(n.Fingerprint), short(n.Fingerprint)), now)
			if err != nil {
				return inventory.Transition{}, false, err
			}
			m.Approval = nil
			return t, true, nil
		}
	}
	return inventory.Transition{}, false, nil
}

// short abbreviates a key fingerprint for messages.
func short(fp string) string {
	if len(fp) > 19 {
		return fp[:19]
	}
	return fp
}

package enroll

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// GossipRing is a rack's gossip key ring (decision 0406). Outside a rotation it holds
// one key. `gpuboot gossip rotate` adds Next, which agents accept beside Primary
// (installing); when every live agent of the rack has it, Next becomes Primary and the
// old key is only accepted (Retiring); when every live agent has that, the old key is
// dropped. A member one step behind the others therefore always shares a key with
// them: nobody drops out of the rack.
type GossipRing struct {
	Primary  []byte // the key agents encrypt with
	Next     []byte // installing: accepted now, Primary next
	Retiring []byte // retiring: the previous Primary, accepted until dropped
}

// Phase is the rotation step the ring is at.
func (r GossipRing) Phase() bootv1.GossipRotationPhase {
	switch {
	case r.Next != nil:
		return bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING
	case r.Retiring != nil:
		return bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING
	}
	return bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY
}

// Accepted are the keys agents accept besides Primary.
func (r GossipRing) Accepted() [][]byte {
	var out [][]byte
	for _, k := range [][]byte{r.Next, r.Retiring} {
		if k != nil {
			out = append(out, k)
		}
	}
	return out
}

// Digest names the ring as agents report it (bootv1.GossipKeyringDigest).
func (r GossipRing) Digest() string { return bootv1.GossipKeyringDigest(r.Primary, r.Accepted()) }

// advance is the ring after the next rotation step; steady rings do not move.
func (r GossipRing) advance() GossipRing {
	switch r.Phase() {
	case bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING:
		return GossipRing{Primary: r.Next, Retiring: r.Primary}
	case bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING:
		return GossipRing{Primary: r.Primary}
	}
	return r
}

// maxRingFile bounds a ring file: three keys in hex and a comment fit many times over.
const maxRingFile = 4096

// ParseGossipRing reads a ring file: lines "primary HEX", "next HEX" or "retiring HEX",
// '#' comments and blank lines. A file of one bare hex line (what gpuboot wrote before
// rotation existed) is a ring of that one key. Keys are 16, 24 or 32 bytes; a ring has
// a primary and at most one of next and retiring.
func ParseGossipRing(data []byte) (GossipRing, error) {
	var r GossipRing
	if len(data) > maxRingFile {
		return r, fmt.Errorf("gossip key ring: %d bytes; at most %d", len(data), maxRingFile)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	seen := map[string]bool{}
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		role, value, found := strings.Cut(text, " ")
		if !found {
			role, value = "primary", text // the one-key format
		}
		value = strings.TrimSpace(value)
		if role != "primary" && role != "next" && role != "retiring" {
			return GossipRing{}, fmt.Errorf("gossip key ring line %d: %q is not primary, next or retiring", line, role)
		}
		if seen[role] {
			return GossipRing{}, fmt.Errorf("gossip key ring line %d: a second %s key", line, role)
		}
		seen[role] = true
		key, err := hex.DecodeString(value)
		if err != nil {
			return GossipRing{}, fmt.Errorf("gossip key ring line %d: %s key is not hex", line, role)
		}
		if n := len(key); n != 16 && n != 24 && n != 32 {
			return GossipRing{}, fmt.Errorf("gossip key ring line %d: %s key is %d bytes; want 16, 24 or 32", line, role, n)
		}
		switch role {
		case "primary":
			r.Primary = key
		case "next":
			r.Next = key
		case "retiring":
			r.Retiring = key
		}
	}
	if err := sc.Err(); err != nil {
		return GossipRing{}, fmt.Errorf("gossip key ring: %w", err)
	}
	switch {
	case r.Primary == nil:
		return GossipRing{}, errors.New("gossip key ring: no primary key")
	case r.Next != nil && r.Retiring != nil:
		return GossipRing{}, errors.New("gossip key ring: both a next and a retiring key (a rotation moves one step at a time)")
	case bytes.Equal(r.Primary, r.Next) || bytes.Equal(r.Primary, r.Retiring):
		return GossipRing{}, errors.New("gossip key ring: the same key twice")
	}
	return r, nil
}

// Marshal is the ring file ParseGossipRing reads.
func (r GossipRing) Marshal(rack string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# gpuboot gossip key ring for rack %s: the key agents encrypt with (primary) and,\n", rack)
	b.WriteString("# during `gpuboot gossip rotate`, the one they also accept (next or retiring).\n")
	fmt.Fprintf(&b, "primary %s\n", hex.EncodeToString(r.Primary))
	if r.Next != nil {
		fmt.Fprintf(&b, "next %s\n", hex.EncodeToString(r.Next))
	}
	if r.Retiring != nil {
		fmt.Fprintf(&b, "retiring %s\n", hex.EncodeToString(r.Retiring))
	}
	return b.Bytes()
}

// LoadGossipRing reads rack's ring from dir/RACK.key.
func LoadGossipRing(dir, rack string) (GossipRing, error) {
	p := filepath.Join(dir, rack+".key")
	data, err := os.ReadFile(p)
	if err != nil {
		return GossipRing{}, err
	}
	r, err := ParseGossipRing(data)
	if err != nil {
		return GossipRing{}, fmt.Errorf("%s: %w", p, err)
	}
	return r, nil
}

// rings holds every rack's ring and its rotation bookkeeping.
type rings struct {
	mu    sync.Mutex
	dir   string // where RACK.key files live; "" keeps rings in memory only
	racks map[string]*rackRing
}

type rackRing struct {
	ring      GossipRing
	since     time.Time // when the phase began (zero: steady since start)
	lastCheck time.Time // when advancing was last considered
}

func newRings(cfg Config) (*rings, error) {
	rs := &rings{dir: cfg.GossipKeyDir, racks: map[string]*rackRing{}}
	for name, r := range cfg.Racks {
		ring := GossipRing{Primary: r.GossipKey}
		if rs.dir != "" {
			loaded, err := LoadGossipRing(rs.dir, name)
			if err != nil {
				return nil, fmt.Errorf("rack %s: %w", name, err)
			}
			ring = loaded
		}
		rs.racks[name] = &rackRing{ring: ring}
	}
	return rs, nil
}

// get returns rack's ring; ok is false for a rack without a key.
func (rs *rings) get(rack string) (GossipRing, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.racks[rack]
	if !ok || len(r.ring.Primary) == 0 {
		return GossipRing{}, false
	}
	return r.ring, true
}

// set stores rack's new ring, on disk first. Called with rs.mu held.
func (rs *rings) set(rack string, r *rackRing, next GossipRing, now time.Time) error {
	if rs.dir != "" {
		if err := atomicfile.Write(filepath.Join(rs.dir, rack+".key"), next.Marshal(rack), 0o600); err != nil {
			return fmt.Errorf("gossip key ring for rack %s: %w", rack, err)
		}
	}
	r.ring, r.since = next, now
	return nil
}

// gossipAnswer is the ring to put in a heartbeat answer: set when the caller holds an
// agent certificate of a machine in a rack with a key and reported another ring.
func (s *Service) gossipAnswer(c *caller, m *inventory.Machine, reported string) *bootv1.GossipConfig {
	if !c.viaCert || m.Rack == "" {
		return nil
	}
	ring, ok := s.rings.get(m.Rack)
	if !ok || ring.Digest() == reported {
		return nil
	}
	return &bootv1.GossipConfig{Key: slices.Clone(ring.Primary), AcceptedKeys: ring.Accepted(), Rack: m.Rack}
}

// ringCheckEvery bounds how often heartbeats that change nothing make gpuboot read the
// inventory to see whether a rack's rotation can move on (an agent that stopped
// heartbeating no longer holds it once its key liveness ends).
const ringCheckEvery = 10 * time.Second

// advanceRing moves rack's rotation one step when every live agent of the rack reports
// the current ring. It reads the inventory only while a rotation is under way: when an
// agent's heartbeat reported another ring than its last one (changed), and otherwise at
// most once per ringCheckEvery; so at most one inventory read per agent and step.
func (s *Service) advanceRing(ctx context.Context, rack string, changed bool) {
	now := s.cfg.Now()
	s.rings.mu.Lock()
	r, ok := s.rings.racks[rack]
	if !ok || r.ring.Phase() == bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY || (!changed && now.Sub(r.lastCheck) < ringCheckEvery) {
		s.rings.mu.Unlock()
		return
	}
	r.lastCheck = now
	s.rings.mu.Unlock()
	if _, err := s.tryAdvance(ctx, rack); err != nil {
		s.log.Warn("gossip key rotation", "rack", rack, "error", err)
	}
}

// tryAdvance moves rack's rotation one step if no live agent is behind, and returns
// the agents that are.
func (s *Service) tryAdvance(ctx context.Context, rack string) ([]string, error) {
	ring, ok := s.rings.get(rack)
	if !ok || ring.Phase() == bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		return nil, nil
	}
	behind, err := s.ringBehind(ctx, rack)
	if err != nil || len(behind) > 0 {
		return behind, err
	}
	s.rings.mu.Lock()
	defer s.rings.mu.Unlock()
	r := s.rings.racks[rack]
	if r.ring.Digest() != ring.Digest() {
		return nil, nil // another call moved it meanwhile
	}
	next := r.ring.advance()
	if err := s.rings.set(rack, r, next, s.cfg.Now()); err != nil {
		return nil, err
	}
	s.log.Info("gossip key rotation advanced: every live agent of the rack has the ring", "rack", rack,
		"from", protoconv.PhaseWord(ring.Phase()), "to", protoconv.PhaseWord(next.Phase()), "primary", bootv1.GossipKeyFingerprint(next.Primary))
	return nil, nil
}

// ringBehind names the live agents of rack (a heartbeat within inventory.KeyLiveness,
// holding an agent certificate) whose last heartbeat reported another ring than the
// rack's current one.
func (s *Service) ringBehind(ctx context.Context, rack string) ([]string, error) {
	ring, ok := s.rings.get(rack)
	if !ok {
		return nil, nil
	}
	want := ring.Digest()
	all, err := s.store.List(ctx)
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	var behind []string
	for _, m := range all {
		if m.Rack != rack || len(m.AgentCertSerials) == 0 || m.State == inventory.Decommissioned || m.State == inventory.Rejected {
			continue
		}
		if m.LastHeartbeat.IsZero() || now.Sub(m.LastHeartbeat) > inventory.KeyLiveness {
			continue // not live: it takes the ring from its next heartbeat's answer
		}
		if m.GossipKeyring != want {
			name := m.NodeName
			if name == "" {
				name = m.ID
			}
			behind = append(behind, name)
		}
	}
	slices.Sort(behind)
	return behind, nil
}

// RotateGossipKey starts replacing rack's gossip key (AdminService.RotateGossipKey).
func (s *Service) RotateGossipKey(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error) {
	s.rings.mu.Lock()
	r, ok := s.rings.racks[rack]
	if !ok {
		s.rings.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "no rack %q in gpuboot.yaml", rack)
	}
	if p := r.ring.Phase(); p != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		s.rings.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "rack %s is already rotating its gossip key (%s); see `gpuboot gossip status %s`", rack, protoconv.PhaseWord(p), rack)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		s.rings.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "new gossip key: %v", err)
	}
	now := s.cfg.Now()
	if err := s.rings.set(rack, r, GossipRing{Primary: r.ring.Primary, Next: key}, now); err != nil {
		s.rings.mu.Unlock()
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.rings.mu.Unlock()
	s.log.Info("gossip key rotation started", "rack", rack, "next", bootv1.GossipKeyFingerprint(key))
	return s.ringStatus(ctx, rack)
}

// GossipKeyStatus reports rack's ring by fingerprint (AdminService.GetGossipKeyStatus).
// Asking moves a rotation on when no live agent is behind (a rack with no live agent
// has nobody to wait for, and sends no heartbeat that would).
func (s *Service) GossipKeyStatus(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error) {
	if _, err := s.tryAdvance(ctx, rack); err != nil {
		return nil, status.Errorf(codes.Internal, "gossip key status: %v", err)
	}
	return s.ringStatus(ctx, rack)
}

// ringStatus is rack's ring as GossipKeyStatus.
func (s *Service) ringStatus(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error) {
	s.rings.mu.Lock()
	r, ok := s.rings.racks[rack]
	var ring GossipRing
	var since time.Time
	if ok {
		ring, since = r.ring, r.since
	}
	s.rings.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no rack %q in gpuboot.yaml", rack)
	}
	st := &bootv1.GossipKeyStatus{Rack: rack, Phase: ring.Phase(), PrimaryFingerprint: bootv1.GossipKeyFingerprint(ring.Primary)}
	for _, k := range ring.Accepted() {
		st.AcceptedFingerprints = append(st.AcceptedFingerprints, bootv1.GossipKeyFingerprint(k))
	}
	if !since.IsZero() {
		st.PhaseSince = timestamppb.New(since)
	}
	if ring.Phase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		behind, err := s.ringBehind(ctx, rack)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "gossip key status: %v", err)
		}
		st.Behind = behind
	}
	return st, nil
}

package enroll

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

func TestParseGossipRing(t *testing.T) {
	k1 := strings.Repeat("ab", 32)
	k2 := strings.Repeat("cd", 16)
	for _, c := range []struct {
		name, in string
		want     bootv1.GossipRotationPhase
		err      string
	}{
		{"one bare key (before rotation existed)", k1 + "\n", bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY, ""},
		{"installing", "# c\nprimary " + k1 + "\n\nnext " + k2 + "\n", bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING, ""},
		{"retiring", "primary " + k2 + "\nretiring " + k1 + "\n", bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING, ""},
		{"empty", "# nothing\n", 0, "no primary key"},
		{"bad role", "primary " + k1 + "\nspare " + k2 + "\n", 0, `line 2: "spare" is not primary, next or retiring`},
		{"two primaries", "primary " + k1 + "\nprimary " + k2 + "\n", 0, "line 2: a second primary key"},
		{"not hex", "primary zz\n", 0, "line 1: primary key is not hex"},
		{"short", "primary abcd\n", 0, "line 1: primary key is 2 bytes; want 16, 24 or 32"},
		{"both steps", "primary " + k1 + "\nnext " + k2 + "\nretiring " + strings.Repeat("ef", 16) + "\n", 0, "both a next and a retiring key"},
		{"same key twice", "primary " + k1 + "\nnext " + k1 + "\n", 0, "the same key twice"},
		{"too large", strings.Repeat("#", maxRingFile+1), 0, "at most 4096"},
	} {
		r, err := ParseGossipRing([]byte(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r.Phase() != c.want {
			t.Errorf("%s: phase %s, want %s", c.name, r.Phase(), c.want)
		}
		back, err := ParseGossipRing(r.Marshal("r1"))
		if err != nil || back.Digest() != r.Digest() || back.Phase() != r.Phase() {
			t.Errorf("%s: marshal round trip: %+v, %v", c.name, back, err)
		}
	}
}

func FuzzParseGossipRing(f *testing.F) {
	f.Add([]byte(strings.Repeat("ab", 32) + "\n"))
	f.Add([]byte("primary " + strings.Repeat("ab", 16) + "\nnext " + strings.Repeat("cd", 24) + "\n"))
	f.Add([]byte("primary x\nretiring y"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseGossipRing(data)
		if err != nil {
			return
		}
		back, err := ParseGossipRing(r.Marshal("r"))
		if err != nil {
			t.Fatalf("a ring that parsed does not parse after Marshal: %v", err)
		}
		if !bytes.Equal(back.Primary, r.Primary) || back.Phase() != r.Phase() || back.Digest() != r.Digest() {
			t.Fatalf("round trip changed the ring: %+v -> %+v", r, back)
		}
	})
}

// ringAgent is a joined test agent that heartbeats over mutual TLS reporting the key
// ring it holds, and installs the ring an answer brings, as gpuagent does.
type ringAgent struct {
	a        *agent
	mtls     bootv1.EnrollmentServiceClient
	node     string
	primary  []byte
	accepted [][]byte
}

func (r *ringAgent) heartbeat(t *testing.T) *bootv1.HeartbeatResponse {
	t.Helper()
	req := &bootv1.HeartbeatRequest{Identity: r.a.facts.Identity, NodeName: r.node,
		Health:        &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true},
		GossipKeyring: bootv1.GossipKeyringDigest(r.primary, r.accepted)}
	resp, err := r.mtls.Heartbeat(context.Background(), req)
	if err != nil {
		t.Fatalf("heartbeat of %s: %v", r.node, err)
	}
	if g := resp.GetGossip(); g != nil {
		r.primary, r.accepted = g.GetKey(), g.GetAcceptedKeys()
	}
	return resp
}

// TestGossipKeyRotation drives `gpuboot gossip rotate` through its steps: each waits
// for every live agent of the rack to report the ring; an agent that is not live does
// not hold it; the ring reaches agents only over mutual TLS; the file on disk follows
// every step, so a restarted gpuboot resumes where it was.
func TestGossipKeyRotation(t *testing.T) {
	dir := t.TempDir()
	oldKey := bytes.Repeat([]byte{7}, 32)
	if err := os.WriteFile(filepath.Join(dir, "r1.key"), []byte(hex.EncodeToString(oldKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.GossipKeyDir = dir })
	ctx := context.Background()
	var agents []*ringAgent
	for _, mac := range []string{"52:54:00:00:00:71", "52:54:00:00:00:72", "52:54:00:00:00:73"} {
		a, mtls, node := joined(e, mac)
		ra := &ringAgent{a: a, mtls: mtls, node: node}
		agents = append(agents, ra)
	}
	// The bundles carried the key from the file; agents start from it.
	for _, ra := range agents {
		ra.primary = oldKey
	}
	// The third machine's agent heartbeats once, then goes quiet for longer than the
	// key liveness window: it must not hold the rotation.
	agents[2].heartbeat(t)
	e.clk.Add(4 * time.Minute)
	live := agents[:2]
	for _, ra := range live {
		if resp := ra.heartbeat(t); resp.GetGossip() != nil {
			t.Fatalf("a heartbeat reporting the current ring got a ring back: %v", resp.GetGossip())
		}
	}

	st, err := e.svc.RotateGossipKey(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if st.GetPhase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING || len(st.GetBehind()) != 2 {
		t.Fatalf("after rotate: %v; want installing, waiting for the two live agents", st)
	}
	if _, err := e.svc.RotateGossipKey(ctx, "r1"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second rotate during a rotation: %v, want FailedPrecondition", err)
	}
	if _, err := e.svc.RotateGossipKey(ctx, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("rotate of an unknown rack: %v, want NotFound", err)
	}
	// A key-signed heartbeat (no agent certificate) never carries keys.
	if resp, err := live[0].a.heartbeat(live[0].a.c, true); err != nil || resp.GetGossip() != nil {
		t.Fatalf("key-signed heartbeat: %v, gossip %v; want an answer without keys", err, resp.GetGossip())
	}

	phase := func() bootv1.GossipRotationPhase {
		t.Helper()
		st, err := e.svc.GossipKeyStatus(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		return st.GetPhase()
	}
	onDisk := func() GossipRing {
		t.Helper()
		r, err := LoadGossipRing(dir, "r1")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Step 1, installing: the first agent takes the ring; the rotation waits for the other.
	live[0].heartbeat(t)
	if len(live[0].accepted) != 1 || !bytes.Equal(live[0].primary, oldKey) {
		t.Fatalf("installing ring: primary %x accepted %d; want the old key plus one", live[0].primary, len(live[0].accepted))
	}
	newKey := live[0].accepted[0]
	e.clk.Add(2 * time.Second)
	live[0].heartbeat(t)
	if st, _ := e.svc.GossipKeyStatus(ctx, "r1"); st.GetPhase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING || !slices.Equal(st.GetBehind(), []string{live[1].node}) {
		t.Fatalf("with one agent behind: %v; want installing, waiting for %s", st, live[1].node)
	}
	// A machine joining now gets the whole ring in its bundle.
	_, _, _ = joined(e, "52:54:00:00:00:74")
	if r := onDisk(); r.Phase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING || !bytes.Equal(r.Next, newKey) {
		t.Fatalf("ring on disk while installing: %+v", r)
	}
	live[1].heartbeat(t) // takes the ring
	e.clk.Add(2 * time.Second)
	live[1].heartbeat(t) // reports it: every live agent has it
	if p := phase(); p != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING {
		t.Fatalf("every live agent reported the installing ring; phase %s, want retiring", p)
	}
	if r := onDisk(); !bytes.Equal(r.Primary, newKey) || !bytes.Equal(r.Retiring, oldKey) {
		t.Fatalf("ring on disk while retiring: %+v", r)
	}
	// Step 2, retiring: agents encrypt with the new key and still accept the old one.
	for _, ra := range live {
		ra.heartbeat(t)
		if !bytes.Equal(ra.primary, newKey) || len(ra.accepted) != 1 || !bytes.Equal(ra.accepted[0], oldKey) {
			t.Fatalf("%s: retiring ring primary %x accepted %x", ra.node, ra.primary, ra.accepted)
		}
	}
	e.clk.Add(2 * time.Second)
	for _, ra := range live {
		ra.heartbeat(t)
	}
	// Step 3, steady: the old key is gone everywhere.
	if p := phase(); p != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		t.Fatalf("phase %s, want steady", p)
	}
	if r := onDisk(); !bytes.Equal(r.Primary, newKey) || r.Next != nil || r.Retiring != nil {
		t.Fatalf("ring on disk at the end: %+v", r)
	}
	// The agent that was away comes back with the old ring and gets the new one at once.
	agents[2].heartbeat(t)
	if !bytes.Equal(agents[2].primary, newKey) || len(agents[2].accepted) != 0 {
		t.Fatalf("returning agent got primary %x accepted %d", agents[2].primary, len(agents[2].accepted))
	}
	// A restarted gpuboot reads the ring from the file.
	e2 := newEnv(t, func(c *Config) { c.GossipKeyDir = dir })
	if st, err := e2.svc.GossipKeyStatus(ctx, "r1"); err != nil || st.GetPrimaryFingerprint() != bootv1.GossipKeyFingerprint(newKey) {
		t.Fatalf("after restart: %v, %v", st, err)
	}
}

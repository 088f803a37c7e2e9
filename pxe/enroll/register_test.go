package enroll

import (
	"bytes"
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// TestDecideRegister runs the pure Register decision over the cases of CONTRACTS §2.3,
// §2.4 and §2.8, with no store, clock or randomness.
func TestDecideRegister(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dead := inventory.KeyLiveness + time.Minute
	key := func(fp string, registeredAgo, seenAgo time.Duration) inventory.Key {
		return inventory.Key{Fingerprint: fp, RegisteredAt: now.Add(-registeredAgo), LastSeen: now.Add(-seenAgo)}
	}
	machine := func(st inventory.State, bound string, keys ...inventory.Key) *inventory.Machine {
		return &inventory.Machine{ID: "m1", Identity: identity.Identity{MAC: "52:54:00:00:00:01"}, State: st,
			BoundKey: bound, Keys: keys, Rack: "r1"}
	}
	withSerials := func(m *inventory.Machine, serials ...string) *inventory.Machine {
		m.AgentCertSerials = serials
		return m
	}
	secret := bytes.Repeat([]byte{1}, tokenSecretSize)
	challenge := bytes.Repeat([]byte{2}, bootv1.ChallengeSize)
	newToken := "m1." + base64.RawURLEncoding.EncodeToString(secret)
	auto := registerRules{Reenroll: ReenrollAuto, TokenTTL: 5 * time.Minute}
	manual := registerRules{Reenroll: ReenrollManual, TokenTTL: 5 * time.Minute}
	approveAll := policy.Decision{Approve: true, Actor: "policy:auto", Reason: "approval mode auto approves every machine"}

	for _, tc := range []struct {
		name    string
		stored  *inventory.Machine
		fp      string
		verdict policy.Decision
		rules   registerRules
		heldBy  string // registerCall.RowHeldBy

		err     error
		status  bootv1.RegisterStatus
		message string // a part of the answer's message
		state   inventory.State
		bound   string
		keys    []string
		moves   []string // "from→to by actor"
		revoke  []string
		token   string
	}{
		{name: "decommissioned machine is told so", stored: machine(inventory.Decommissioned, ""), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_DECOMMISSIONED, message: "reboot it", state: inventory.Decommissioned},
		{name: "rejected machine is told so", stored: machine(inventory.Rejected, "", key("A", time.Hour, time.Minute)), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_REJECTED, state: inventory.Rejected, keys: []string{"A"}},
		{name: "discovered machine's first key registers", stored: machine(inventory.Discovered, ""), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "waiting for approval", state: inventory.Registered,
			keys: []string{"B"}, moves: []string{"discovered→registered by agent:B"}},
		{name: "registered machine polls, manual approval", stored: machine(inventory.Registered, "", key("B", time.Minute, 10*time.Second)), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "waiting for approval", state: inventory.Registered, keys: []string{"B"}},
		{name: "policy approves a registered machine", stored: machine(inventory.Registered, "", key("B", time.Minute, 10*time.Second)), fp: "B",
			verdict: approveAll, rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"},
			moves: []string{"registered→approved by policy:auto"}, token: newToken},
		{name: "allowlist row bound to another machine: waits for an operator",
			stored: machine(inventory.Registered, "", key("B", time.Minute, 10*time.Second)), fp: "B",
			verdict: policy.Decision{Line: 2}, heldBy: "m2", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "bound to machine m2", state: inventory.Registered, keys: []string{"B"}},
		{name: "policy approves at the first Register", stored: machine(inventory.Discovered, ""), fp: "B", verdict: approveAll, rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"},
			moves: []string{"discovered→registered by agent:B", "registered→approved by policy:auto"}, token: newToken},
		{name: "pre-approved machine binds its first key", stored: machine(inventory.Approved, ""), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"},
			moves: []string{"approved→approved by agent:B"}, token: newToken},
		{name: "an outstanding approval is answered again", stored: func() *inventory.Machine {
			m := machine(inventory.Approved, "B", key("B", time.Minute, 10*time.Second))
			m.Approval = &inventory.Approval{Token: "m1.old", Challenge: []byte("c"), KeyFingerprint: "B", ExpiresAt: now.Add(time.Minute)}
			return m
		}(), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"}, token: "m1.old"},
		{name: "an expired approval is replaced", stored: func() *inventory.Machine {
			m := machine(inventory.Approved, "B", key("B", time.Minute, 10*time.Second))
			m.Approval = &inventory.Approval{Token: "m1.old", Challenge: []byte("c"), KeyFingerprint: "B", ExpiresAt: now}
			return m
		}(), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"}, token: newToken},
		{name: "bundle already released to this key", stored: func() *inventory.Machine {
			m := machine(inventory.Joining, "B", key("B", time.Minute, 10*time.Second))
			m.Keys[0].BundleReleased = true
			return m
		}(), fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_BUNDLE_RELEASED, state: inventory.Joining, bound: "B", keys: []string{"B"}},
		{name: "bound key gone, reenroll auto binds the new key", stored: withSerials(machine(inventory.Ready, "A", key("A", time.Hour, dead)), "0a", "0b"),
			fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_APPROVED, state: inventory.Approved, bound: "B", keys: []string{"B"},
			moves: []string{"ready→approved by policy:reenroll-auto"}, revoke: []string{"0a", "0b"}, token: newToken},
		{name: "bound key gone, reenroll manual waits for an operator", stored: withSerials(machine(inventory.Ready, "A", key("A", time.Hour, dead)), "0a"),
			fp: "B", rules: manual,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "waiting for approval", state: inventory.Registered, keys: []string{"B"},
			moves: []string{"ready→registered by policy:reenroll-manual"}, revoke: []string{"0a"}},
		{name: "bound key gone, reenroll manual: the allowlist row does not approve the new key in the operator's stead",
			stored: withSerials(machine(inventory.Ready, "A", key("A", time.Hour, dead)), "0a"), fp: "B", rules: manual,
			verdict: policy.Decision{Approve: true, Actor: "policy:allowlist:2", Reason: "listed", Line: 2},
			status:  bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "re-enrolls with a new key under reenroll: manual", state: inventory.Registered,
			keys: []string{"B"}, moves: []string{"ready→registered by policy:reenroll-manual"}, revoke: []string{"0a"}},
		{name: "a machine waiting after a manual re-enrollment: its row still does not approve it",
			stored: func() *inventory.Machine {
				m := machine(inventory.Registered, "", key("B", time.Minute, 10*time.Second))
				m.AllowlistSpent = true
				return m
			}(), fp: "B", rules: manual, verdict: policy.Decision{Approve: true, Actor: "policy:allowlist:2", Reason: "listed", Line: 2},
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "an operator must approve it", state: inventory.Registered, keys: []string{"B"}},
		{name: "bound key still live: the new key waits beside it", stored: machine(inventory.Ready, "A", key("A", time.Hour, time.Minute)),
			fp: "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "another key (A) is bound", state: inventory.Ready, bound: "A",
			keys: []string{"A", "B"}},
		{name: "both keys live after the newer registered, none bound: conflict",
			stored: machine(inventory.Registered, "", key("A", time.Hour, 10*time.Second), key("B", time.Minute, 30*time.Second)),
			fp:     "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT, message: "resolve the conflict", state: inventory.Conflict,
			keys: []string{"A", "B"}, moves: []string{"registered→conflict by gpuboot"}},
		{name: "a live bound key is not displaced by a newer key that keeps calling",
			stored: machine(inventory.Ready, "A", key("A", time.Hour, 10*time.Second), key("B", time.Minute, 30*time.Second)),
			fp:     "B", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "another key (A) is bound", state: inventory.Ready, bound: "A",
			keys: []string{"A", "B"}},
		{name: "a third key while two are live is not stored",
			stored: machine(inventory.Registered, "", key("A", time.Hour, 10*time.Second), key("B", time.Minute, 20*time.Second)),
			fp:     "C", rules: auto,
			status: bootv1.RegisterStatus_REGISTER_STATUS_PENDING, message: "two other keys", state: inventory.Registered, keys: []string{"A", "B"}},
		{name: "a record in a state the lifecycle does not know is an error, not a silent no-op",
			stored: machine(inventory.State("bogus"), "A", key("A", time.Hour, dead)), fp: "B", rules: auto,
			err: inventory.ErrIllegalTransition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.stored.Clone()
			call := registerCall{Key: inventory.Key{Fingerprint: tc.fp, RegisteredAt: now, LastSeen: now}, Facts: []byte("facts"),
				Verdict: tc.verdict, Now: now, TokenSecret: secret, Challenge: challenge, RowHeldBy: tc.heldBy}
			d, err := decideRegister(tc.stored, call, tc.rules)
			if !reflect.DeepEqual(tc.stored, before) {
				t.Errorf("the stored machine was changed:\n%+v\nwas\n%+v", tc.stored, before)
			}
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v; want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m, r := d.Machine, d.Response
			if r.Status != tc.status || !strings.Contains(r.Message, tc.message) {
				t.Errorf("answer %s %q; want %s containing %q", r.Status, r.Message, tc.status, tc.message)
			}
			if r.MachineState != protoconv.StateProto(m.State) || m.State != tc.state {
				t.Errorf("state %s (answer says %s); want %s", m.State, r.MachineState, tc.state)
			}
			if m.BoundKey != tc.bound {
				t.Errorf("bound key %q; want %q", m.BoundKey, tc.bound)
			}
			var keys []string
			for _, k := range m.Keys {
				keys = append(keys, k.Fingerprint)
			}
			if !reflect.DeepEqual(keys, tc.keys) {
				t.Errorf("keys %v; want %v", keys, tc.keys)
			}
			var moves []string
			for _, tr := range d.Transitions {
				moves = append(moves, string(tr.From)+"→"+string(tr.To)+" by "+tr.Actor)
				if tr.MachineID != "m1" || !tr.Time.Equal(now) || tr.Reason == "" {
					t.Errorf("transition %+v: want machine m1, time %s and a reason", tr, now)
				}
			}
			if !reflect.DeepEqual(moves, tc.moves) {
				t.Errorf("moves %q; want %q", moves, tc.moves)
			}
			if !reflect.DeepEqual(d.Revoke, tc.revoke) {
				t.Errorf("revoke %v; want %v", d.Revoke, tc.revoke)
			}
			if r.Token != tc.token {
				t.Errorf("token %q; want %q", r.Token, tc.token)
			}
			if tc.token == newToken {
				if !bytes.Equal(r.Challenge, challenge) || r.Ttl.AsDuration() != tc.rules.TokenTTL {
					t.Errorf("new approval: challenge %x, ttl %v; want the drawn challenge and %v", r.Challenge, r.Ttl.AsDuration(), tc.rules.TokenTTL)
				}
				if a := m.Approval; a == nil || a.Token != newToken || a.KeyFingerprint != tc.fp || !a.ExpiresAt.Equal(now.Add(tc.rules.TokenTTL)) {
					t.Errorf("stored approval %+v; want token %q for key %s expiring %s", a, newToken, tc.fp, now.Add(tc.rules.TokenTTL))
				}
			}
			if current := m.BoundKey == tc.fp || (m.BoundKey == "" && len(keys) == 1 && keys[0] == tc.fp); current && m.State != inventory.Decommissioned && m.State != inventory.Rejected {
				if string(m.Facts) != "facts" {
					t.Errorf("facts of the current key not stored: %q", m.Facts)
				}
			}
		})
	}
}

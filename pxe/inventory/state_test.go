package inventory

import (
	"errors"
	"testing"
	"time"
)

func TestTransitionTable(t *testing.T) {
	legal := []struct{ from, to State }{
		{None, Discovered}, {None, Registered},
		{Discovered, Registered}, {Discovered, Approved}, {Discovered, Rejected},
		{Registered, Approved}, {Registered, Rejected},
		{Approved, Joining}, {Joining, Commissioning},
		{Commissioning, Ready}, {Commissioning, Quarantined},
		{Ready, Quarantined}, {Quarantined, Ready},
		{Rejected, Approved},
		{Decommissioned, Discovered},
		{Ready, Conflict}, {Conflict, Ready}, {Conflict, Approved},
		{Ready, Approved}, {Ready, Registered}, // re-enrollment auto / manual
	}
	for _, c := range legal {
		if !Allowed(c.from, c.to) {
			t.Errorf("%q → %q should be allowed", c.from, c.to)
		}
	}
	illegal := []struct{ from, to State }{
		{None, Approved}, {None, Ready},
		{Discovered, Joining}, {Discovered, Ready},
		{Registered, Joining}, {Registered, Ready}, {Registered, Registered},
		{Approved, Ready}, {Joining, Ready},
		{Rejected, Joining}, {Rejected, Registered},
		{Decommissioned, Approved}, {Decommissioned, Ready},
		{Ready, Ready}, {Ready, Joining},
	}
	for _, c := range illegal {
		if Allowed(c.from, c.to) {
			t.Errorf("%q → %q should be illegal", c.from, c.to)
		}
	}
	// Every state can be decommissioned.
	for _, s := range States {
		if s != Decommissioned && !Allowed(s, Decommissioned) {
			t.Errorf("%s → decommissioned should be allowed", s)
		}
	}
}

func TestMove(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	m := &Machine{ID: "m1", State: Registered}
	if _, err := Move(m, Joining, "operator:alice", "why", now); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("registered → joining: err = %v, want ErrIllegalTransition", err)
	}
	if m.State != Registered {
		t.Fatalf("illegal move changed the state to %s", m.State)
	}
	if _, err := Move(m, Approved, "", "why", now); err == nil {
		t.Fatal("move without actor succeeded")
	}
	tr, err := Move(m, Approved, "operator:alice", "looks good", now)
	if err != nil {
		t.Fatal(err)
	}
	if tr.From != Registered || tr.To != Approved || tr.Actor != "operator:alice" || !tr.Time.Equal(now) || m.State != Approved {
		t.Fatalf("transition %+v, machine state %s", tr, m.State)
	}
	if _, err := Move(m, Conflict, "gpuboot", "two keys", now); err != nil {
		t.Fatal(err)
	}
	if m.PreConflict != Approved {
		t.Fatalf("PreConflict = %q, want approved", m.PreConflict)
	}
}

func TestParseState(t *testing.T) {
	for _, s := range States {
		got, err := ParseState(string(s))
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseState("bogus"); err == nil {
		t.Error("ParseState(bogus) succeeded")
	}
}

func TestCheckHistory(t *testing.T) {
	ok := []Transition{{Seq: 1, From: None, To: Discovered}, {Seq: 2, From: Discovered, To: Registered}}
	if err := CheckHistory(ok, Registered); err != nil {
		t.Fatal(err)
	}
	if err := CheckHistory(ok, Approved); err == nil {
		t.Fatal("history ending in registered accepted for an approved machine")
	}
	gap := []Transition{{Seq: 1, From: None, To: Discovered}, {Seq: 2, From: Registered, To: Approved}}
	if err := CheckHistory(gap, Approved); err == nil {
		t.Fatal("history with a gap accepted")
	}
}

// TestRecord: an action record keeps the state (From == To), needs action, actor and
// reason, and a stored machine; it passes CheckHistory where a same-state move without
// an action does not.
func TestRecord(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	m := &Machine{ID: "m1", State: Ready, UpdatedAt: now.Add(-time.Hour)}
	tr, err := Record(m, "wipe-data-disk requested", "operator:alice", "/dev/sdb serial S1: old scratch disk", now)
	if err != nil {
		t.Fatal(err)
	}
	if tr.From != Ready || tr.To != Ready || tr.Action != "wipe-data-disk requested" || tr.Actor != "operator:alice" || !tr.Time.Equal(now) {
		t.Fatalf("record %+v", tr)
	}
	if m.State != Ready || !m.UpdatedAt.Equal(now.Add(-time.Hour)) {
		t.Fatalf("Record changed the machine: state %s, updated %s", m.State, m.UpdatedAt)
	}
	for _, c := range []struct{ action, actor, reason string }{{"", "a", "r"}, {"x", "", "r"}, {"x", "a", ""}} {
		if _, err := Record(m, c.action, c.actor, c.reason, now); err == nil {
			t.Errorf("Record(%q, %q, %q) succeeded", c.action, c.actor, c.reason)
		}
	}
	if _, err := Record(&Machine{ID: "m2"}, "x", "a", "r", now); !errors.Is(err, ErrIllegalTransition) {
		t.Errorf("Record on a machine not stored: %v; want ErrIllegalTransition", err)
	}

	h := []Transition{{Seq: 1, From: None, To: Discovered}, {Seq: 2, From: Discovered, To: Approved},
		{Seq: 3, From: Approved, To: Approved, Action: "wipe-data-disk requested"}, {Seq: 4, From: Approved, To: Joining}}
	if err := CheckHistory(h, Joining); err != nil {
		t.Fatalf("history with an action record: %v", err)
	}
	for name, bad := range map[string][]Transition{
		"same-state move without an action": {{Seq: 1, From: None, To: Registered}, {Seq: 2, From: Registered, To: Registered}},
		"action that moves":                 {{Seq: 1, From: None, To: Registered}, {Seq: 2, From: Registered, To: Approved, Action: "x"}},
		"action before the machine exists":  {{Seq: 1, From: None, To: None, Action: "x"}},
	} {
		if err := CheckHistory(bad, bad[len(bad)-1].To); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("%s: CheckHistory = %v; want ErrIllegalTransition", name, err)
		}
	}
}

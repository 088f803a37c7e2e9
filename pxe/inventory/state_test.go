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

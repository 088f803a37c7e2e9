package inventory

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// State is a machine's place in the lifecycle (ARCHITECTURE.md "Machine lifecycle").
// The text form is the one the CLI, the REST API and the rack report show.
type State string

// The lifecycle states. None is the state of a machine that is not recorded yet; a
// stored machine never has it.
const (
	None           State = ""
	Discovered     State = "discovered"
	Registered     State = "registered"
	Approved       State = "approved"
	Joining        State = "joining"
	Commissioning  State = "commissioning"
	Ready          State = "ready"
	Quarantined    State = "quarantined"
	Rejected       State = "rejected"
	Decommissioned State = "decommissioned"
	Conflict       State = "conflict"
)

// States lists every stored state in lifecycle order.
var States = []State{Discovered, Registered, Approved, Joining, Commissioning, Ready,
	Quarantined, Rejected, Decommissioned, Conflict}

// ParseState returns the state named s (case-insensitive), or an error listing the
// valid names.
func ParseState(s string) (State, error) {
	for _, st := range States {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	names := make([]string, len(States))
	for i, st := range States {
		names[i] = string(st)
	}
	return None, fmt.Errorf("unknown machine state %q: use one of %s", s, strings.Join(names, ", "))
}

// Bound reports whether a machine in state s has its identity bound to an agent key by
// an approval (approved and everything after it on the way to ready).
func (s State) Bound() bool {
	switch s {
	case Approved, Joining, Commissioning, Ready, Quarantined:
		return true
	}
	return false
}

// table is the lifecycle: from → the states it may move to. Everything not listed is
// an illegal transition.
var table = map[State][]State{
	// A new identity is recorded by a boot request (discovered) or directly by its
	// agent's Register (registered).
	None: {Discovered, Registered},
	// Register from its agent; approve ahead of the agent (hold mode, allowlist);
	// reject; retire.
	Discovered: {Registered, Approved, Rejected, Decommissioned},
	// Approve or reject; two live keys before approval; retire.
	Registered: {Approved, Rejected, Conflict, Decommissioned},
	// Bundle released; re-enrollment binds a new key (approved → approved records the
	// rebinding) or waits for an operator (registered).
	Approved:      {Joining, Approved, Registered, Conflict, Decommissioned},
	Joining:       {Commissioning, Approved, Registered, Conflict, Decommissioned},
	Commissioning: {Ready, Quarantined, Approved, Registered, Conflict, Decommissioned},
	Ready:         {Quarantined, Approved, Registered, Conflict, Decommissioned},
	Quarantined:   {Ready, Approved, Registered, Conflict, Decommissioned},
	// An operator may correct a rejection.
	Rejected: {Approved, Decommissioned},
	// A decommissioned machine that boots again starts over.
	Decommissioned: {Discovered, Registered},
	// Only an operator resolves a conflict: back to the state before it (the bound key
	// won) or approved (the newer key won); registered when it happened before approval.
	Conflict: {Registered, Approved, Joining, Commissioning, Ready, Quarantined, Decommissioned},
}

// ErrIllegalTransition is wrapped by every error for a move the lifecycle does not
// allow.
var ErrIllegalTransition = errors.New("illegal lifecycle transition")

// Allowed reports whether the lifecycle allows moving from → to.
func Allowed(from, to State) bool {
	return slices.Contains(table[from], to)
}

// Next returns the states a machine in state s may move to.
func Next(s State) []State { return slices.Clone(table[s]) }

// Transition is one persisted lifecycle change.
type Transition struct {
	// Seq orders a machine's transitions; the store assigns it (1, 2, …).
	Seq       uint64    `json:"seq"`
	MachineID string    `json:"machineId"`
	From      State     `json:"from"`
	To        State     `json:"to"`
	Time      time.Time `json:"time"`
	// Actor: "operator:NAME", "policy:RULE", "agent:FINGERPRINT" or "gpuboot".
	Actor string `json:"actor"`
	// Reason: one sentence.
	Reason string `json:"reason"`
	// Action names a recorded action that leaves the state as it was (From == To),
	// such as "wipe-data-disk requested"; empty for a lifecycle move. The history is
	// the audit record of such actions too (Record).
	Action string `json:"action,omitempty"`
}

// legal reports whether t may be stored after a machine in state cur: a lifecycle move
// the table allows, from cur, with no Action; or an action record (Record) of a stored
// machine, From == To == cur. A same-state transition without an Action is a move and
// needs the table (approved → approved, a rebinding, is one).
func (t Transition) legal(cur State) error {
	switch {
	case t.From != cur:
		return fmt.Errorf("%s → %s from state %s: %w", stateName(t.From), t.To, stateName(cur), ErrIllegalTransition)
	case t.Action != "" && (t.From != t.To || t.From == None):
		return fmt.Errorf("action %q recorded as %s → %s: an action leaves a stored machine's state as it was: %w", t.Action, stateName(t.From), t.To, ErrIllegalTransition)
	case t.Action == "" && !Allowed(t.From, t.To):
		return fmt.Errorf("%s → %s: %w", stateName(t.From), t.To, ErrIllegalTransition)
	}
	return nil
}

// Move checks the move of m to state to against the lifecycle table and, if it is
// allowed, sets m.State and m.UpdatedAt and returns the transition to persist with m.
// An illegal move is an error wrapping ErrIllegalTransition that names both states and
// changes nothing. Actor and reason are required: every transition says who and why.
func Move(m *Machine, to State, actor, reason string, now time.Time) (Transition, error) {
	if actor == "" || reason == "" {
		return Transition{}, fmt.Errorf("machine %s: %s → %s: actor and reason are required", m.ID, m.State, to)
	}
	if !Allowed(m.State, to) {
		return Transition{}, fmt.Errorf("machine %s: %s → %s: %w (from %s a machine may go to: %s)",
			m.ID, stateName(m.State), to, ErrIllegalTransition, stateName(m.State), joinStates(table[m.State]))
	}
	t := Transition{MachineID: m.ID, From: m.State, To: to, Time: now.UTC(), Actor: actor, Reason: reason}
	if to == Conflict {
		m.PreConflict = m.State
	}
	m.State = to
	m.UpdatedAt = t.Time
	return t, nil
}

// Record returns the transition that records action (for example "wipe-data-disk
// requested") on m in the history without changing its state: From and To are both
// m's state. Unlike Move it leaves m.UpdatedAt, which says when the state last
// changed. Action, actor and reason are required, and m must be stored (not None).
func Record(m *Machine, action, actor, reason string, now time.Time) (Transition, error) {
	if action == "" || actor == "" || reason == "" {
		return Transition{}, fmt.Errorf("machine %s: record %q: action, actor and reason are required", m.ID, action)
	}
	if m.State == None {
		return Transition{}, fmt.Errorf("machine %s: record %q: the machine is not stored yet: %w", m.ID, action, ErrIllegalTransition)
	}
	return Transition{MachineID: m.ID, From: m.State, To: m.State, Time: now.UTC(), Actor: actor, Reason: reason, Action: action}, nil
}

func stateName(s State) string {
	if s == None {
		return "(new)"
	}
	return string(s)
}

func joinStates(ss []State) string {
	if len(ss) == 0 {
		return "nothing"
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}

// CheckHistory verifies that transitions (one machine's, in order) form a path through
// the lifecycle table starting from None, with increasing Seq, and ends in state final.
// Action records (Record) may stand anywhere after the first transition.
func CheckHistory(ts []Transition, final State) error {
	cur := None
	var seq uint64
	for i, t := range ts {
		if t.From != cur {
			return fmt.Errorf("transition %d (%s → %s): starts from %s but the machine was %s", i+1, t.From, t.To, stateName(t.From), stateName(cur))
		}
		if err := t.legal(cur); err != nil {
			return fmt.Errorf("transition %d: %w", i+1, err)
		}
		if t.Seq <= seq {
			return fmt.Errorf("transition %d: sequence %d after %d", i+1, t.Seq, seq)
		}
		seq, cur = t.Seq, t.To
	}
	if cur != final {
		return fmt.Errorf("history ends in %s but the machine is %s", stateName(cur), stateName(final))
	}
	return nil
}

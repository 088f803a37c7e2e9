package node

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
)

// Every row of the table, and the pairs it leaves out on purpose.
func TestNext(t *testing.T) {
	const illegal = agentv1.EnrollmentState(-1)
	for _, tc := range []struct {
		from agentv1.EnrollmentState
		ev   event
		want agentv1.EnrollmentState
	}{
		// gpuboot's answers while enrolling, again and again, and after a failure (a
		// released bundle re-approved).
		{registering, evRegistering, registering},
		{registering, evWaitingApproval, waiting},
		{waiting, evWaitingApproval, waiting},
		{waiting, evApproved, approved},
		{approved, evRegistering, registering}, // GetJoinBundle failed: Register again
		{failed, evWaitingApproval, waiting},
		{failed, evApproved, approved},
		{registering, evRejected, rejected},
		{waiting, evConflict, conflict},
		{registering, evRefused, failed}, // decommissioned
		// A refused heartbeat, at any point once heartbeats run.
		{joined, evRefused, failed},
		{commissioning, evRefused, failed},
		{rejected, evRefused, failed},
		{conflict, evRefused, failed},
		// The bundle, then the join.
		{registering, evBundleKept, approved},
		{approved, evBundleInUse, joining},
		{failed, evBundleInUse, joining},
		{joining, evJoinRetry, joining},
		{joining, evKubeletStarted, joining},
		{joining, evNodeRegistered, commissioning},
		{joining, evNodeUp, joined},
		{commissioning, evReported, joined},
		{failed, evReported, joined}, // a heartbeat refused during commissioning
		// Steps that are not retried.
		{registering, evStepFailed, failed}, // the key, dialling gpuboot
		{approved, evStepFailed, failed},    // the bundle's credentials
		{joining, evStepFailed, failed},     // kubelet's configuration
		// Illegal: gpuboot's answers once the agent holds its bundle, steps out of order,
		// anything once not enrolling, the end states.
		{joining, evApproved, illegal},
		{joined, evRegistering, illegal},
		{commissioning, evWaitingApproval, illegal},
		{waiting, evBundleInUse, illegal},
		{registering, evNodeRegistered, illegal},
		{approved, evBundleKept, illegal},
		{joined, evNodeRegistered, illegal},
		{failed, evNodeUp, illegal}, // a bundle given at start has no heartbeats to fail
		{joining, evReported, illegal},
		{notEnrolling, evRegistering, illegal},
		{notEnrolling, evStepFailed, illegal},
		{notEnrolling, evRefused, illegal},
		{rejected, evApproved, illegal},
		{conflict, evRegistering, illegal},
		{joined, evStepFailed, illegal},
		{registering, event(99), illegal},
	} {
		got, err := next(tc.from, tc.ev)
		switch {
		case tc.want == illegal:
			if !errors.Is(err, errIllegalMove) || got != tc.from {
				t.Errorf("next(%s, %s) = %s, %v; want %v and no move", tc.from, tc.ev, got, err, errIllegalMove)
			}
		case err != nil || got != tc.want:
			t.Errorf("next(%s, %s) = %s, %v; want %s", tc.from, tc.ev, got, err, tc.want)
		}
	}
}

// The paths the node takes (join.go), event by event from its first state, are legal
// and end where they should.
func TestLifecyclePaths(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start agentv1.EnrollmentState
		evs   []event
		end   agentv1.EnrollmentState
	}{
		{"enroll, kubelet, commission", registering,
			[]event{evRegistering, evRegistering, evWaitingApproval, evWaitingApproval, evApproved, evBundleInUse,
				evJoinRetry, evKubeletStarted, evNodeRegistered, evReported}, joined},
		{"enroll, simulated", registering,
			[]event{evRegistering, evApproved, evBundleInUse, evJoinRetry, evJoinRetry, evNodeRegistered, evReported}, joined},
		{"bundle kept from before a restart", registering,
			[]event{evBundleKept, evBundleInUse, evKubeletStarted, evNodeRegistered, evReported}, joined},
		{"bundle given at start", joining, []event{evJoinRetry, evKubeletStarted, evNodeUp}, joined},
		{"token expired before GetJoinBundle", registering,
			[]event{evRegistering, evWaitingApproval, evApproved, evRegistering, evWaitingApproval, evApproved, evBundleInUse}, joining},
		{"rejected, then heartbeats refused", registering, []event{evRegistering, evWaitingApproval, evRejected, evRefused}, failed},
		{"conflict", registering, []event{evRegistering, evConflict}, conflict},
		{"heartbeat refused while joining", registering,
			[]event{evRegistering, evWaitingApproval, evApproved, evBundleInUse, evRefused, evKubeletStarted, evNodeRegistered, evReported}, joined},
		{"bundle released before, re-approved", registering,
			[]event{evRegistering, evRefused, evWaitingApproval, evApproved, evBundleInUse}, joining},
		{"no cgroup driver", joining, []event{evStepFailed}, failed},
		{"no key", registering, []event{evStepFailed}, failed},
	} {
		st := tc.start
		for i, ev := range tc.evs {
			to, err := next(st, ev)
			if err != nil {
				t.Fatalf("%s: event %d: %v", tc.name, i+1, err)
			}
			st = to
		}
		if st != tc.end {
			t.Errorf("%s: ends in %s, want %s", tc.name, st, tc.end)
		}
	}
}

// Each event has one row, and gpuboot's answers move the node to the state the
// enrollment client reported.
func TestLifecycleTable(t *testing.T) {
	rows := map[event]int{}
	for _, tr := range lifecycle {
		rows[tr.ev]++
	}
	for ev := evRegistering; ev <= evStepFailed; ev++ {
		if rows[ev] != 1 {
			t.Errorf("event %s has %d rows in the table, want 1", ev, rows[ev])
		}
	}
	for _, st := range []agentv1.EnrollmentState{registering, waiting, approved, rejected, conflict, failed} {
		ev, ok := gpubootEvent(st)
		if !ok {
			t.Errorf("the enrollment client's %s has no event", st)
			continue
		}
		if to, err := next(registering, ev); err != nil || to != st {
			t.Errorf("gpuboot's %s from registering: %s, %v", st, to, err)
		}
	}
	for _, st := range []agentv1.EnrollmentState{joining, commissioning, joined, notEnrolling} {
		if ev, ok := gpubootEvent(st); ok {
			t.Errorf("%s is the agent's own state, yet gpubootEvent maps it to %s", st, ev)
		}
	}
}

// move keeps Since across a move to the same state, changes it on a new state, and
// changes nothing on an illegal event.
func TestEnrollStateMove(t *testing.T) {
	since := timestamppb.New(time.Now().Add(-time.Hour))
	e := &enrollState{st: &agentv1.EnrollmentStatus{State: registering, Message: "registering", Since: since}}
	if from, to, err := e.move(evRegistering, "Register failed, retrying"); err != nil || from != registering || to != registering {
		t.Fatalf("move: %s → %s, %v", from, to, err)
	}
	if st := e.get(); st.GetMessage() != "Register failed, retrying" || !st.GetSince().AsTime().Equal(since.AsTime()) {
		t.Errorf("after a move to the same state: %v", st)
	}
	if _, to, err := e.move(evWaitingApproval, "waiting for approval"); err != nil || to != waiting {
		t.Fatalf("move: %s, %v", to, err)
	}
	if st := e.get(); st.GetSince().AsTime().Equal(since.AsTime()) {
		t.Errorf("Since did not change with the state: %v", st)
	}
	before := e.get()
	if _, to, err := e.move(evReported, "joined"); !errors.Is(err, errIllegalMove) || to != waiting {
		t.Errorf("illegal move: %s, %v", to, err)
	}
	if st := e.get(); st.GetMessage() != before.GetMessage() || st.GetState() != waiting {
		t.Errorf("an illegal move changed the status: %v", st)
	}
}

package node

import (
	"errors"
	"fmt"
	"slices"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
)

// The node's life is the enrollment state the agent API reports (agentv1
// EnrollmentState, CONTRACTS §2 and §5): registering with gpuboot, waiting for an
// operator, approved, joining Kubernetes, commissioning, joined; or stopped by gpuboot
// (rejected, conflict) or failed. What moves it is an event; lifecycle is the table of
// which event moves it from which states to which. The code that enrolls and joins
// (join.go) only reports events (node.advance); it never sets a state itself.
//
// failed is not an end: a refused heartbeat reports it while enrollment or the join
// goes on, and gpuboot may answer again (an operator re-approves a machine whose
// bundle was released), so the steps after it stay reachable from it.

// The states, named as the table uses them.
const (
	notEnrolling  = agentv1.EnrollmentState_ENROLLMENT_STATE_NOT_ENROLLING
	registering   = agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING
	waiting       = agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL
	approved      = agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED
	joining       = agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING
	commissioning = agentv1.EnrollmentState_ENROLLMENT_STATE_COMMISSIONING
	joined        = agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED
	rejected      = agentv1.EnrollmentState_ENROLLMENT_STATE_REJECTED
	conflict      = agentv1.EnrollmentState_ENROLLMENT_STATE_CONFLICT
	failed        = agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED
)

// event is something that happened to the node.
type event int

// The events. The first six are gpuboot's answers as the enrollment client reports
// them (gpubootEvent); the others are the agent's own steps.
const (
	evRegistering     event = iota // Register sent, or to be sent again
	evWaitingApproval              // gpuboot: pending an operator's approval
	evApproved                     // gpuboot: approved; the JoinBundle is being fetched
	evRejected                     // gpuboot rejected the machine
	evConflict                     // another live key claims the machine's identity
	evRefused                      // gpuboot ended enrollment or refused a heartbeat
	evBundleKept                   // the JoinBundle kept from before a restart is used
	evBundleInUse                  // the bundle's certificate, listener and gossip are in use
	evJoinRetry                    // a join step failed; it is tried again
	evKubeletStarted               // kubelet.service runs; its TLS bootstrap is awaited
	evNodeRegistered               // the Node exists; commissioning follows
	evNodeUp                       // the Node exists; no commissioning (bundle given at start)
	evReported                     // gpuboot has the commissioning report
	evStepFailed                   // a step that is not retried failed (key, bundle, kubelet config)
)

var eventNames = [...]string{"registering", "waiting-for-approval", "approved", "rejected", "conflict",
	"refused", "bundle-kept", "bundle-in-use", "join-retry", "kubelet-started", "node-registered",
	"node-up", "reported", "step-failed"}

func (e event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", int(e))
}

// transition is one row of the table: ev moves the node from any of from to to.
type transition struct {
	ev   event
	from []agentv1.EnrollmentState
	to   agentv1.EnrollmentState
}

// Groups of states the table repeats.
var (
	// enrolling: while the enrollment client polls, gpuboot's answer sets the state.
	enrolling = []agentv1.EnrollmentState{registering, waiting, approved, failed}
	// heartbeating: heartbeats run from gpuboot's first answer on, beside the rest.
	heartbeating = []agentv1.EnrollmentState{registering, waiting, approved, joining, commissioning, joined, rejected, conflict, failed}
)

// lifecycle is the node's state machine. A (state, event) pair not in it is illegal.
var lifecycle = []transition{
	{evRegistering, enrolling, registering},
	{evWaitingApproval, enrolling, waiting},
	{evApproved, enrolling, approved},
	{evRejected, enrolling, rejected},
	{evConflict, enrolling, conflict},
	{evRefused, heartbeating, failed},
	{evBundleKept, []agentv1.EnrollmentState{registering}, approved},
	{evBundleInUse, []agentv1.EnrollmentState{approved, failed}, joining},
	{evJoinRetry, []agentv1.EnrollmentState{joining, failed}, joining},
	{evKubeletStarted, []agentv1.EnrollmentState{joining, failed}, joining},
	{evNodeRegistered, []agentv1.EnrollmentState{joining, failed}, commissioning},
	{evNodeUp, []agentv1.EnrollmentState{joining}, joined},
	{evReported, []agentv1.EnrollmentState{commissioning, failed}, joined},
	{evStepFailed, []agentv1.EnrollmentState{registering, approved, joining, failed}, failed},
}

// errIllegalMove is wrapped by next's error for a pair the table does not have.
var errIllegalMove = errors.New("illegal node state transition")

// next is the state ev moves the node to from state from, or an error wrapping
// errIllegalMove that names both.
func next(from agentv1.EnrollmentState, ev event) (agentv1.EnrollmentState, error) {
	for _, t := range lifecycle {
		if t.ev == ev && slices.Contains(t.from, from) {
			return t.to, nil
		}
	}
	return from, fmt.Errorf("%s on %s: %w", from, ev, errIllegalMove)
}

// gpubootEvent is the event for a state the enrollment client reports (agent/enroll's
// Progress), which is gpuboot's answer.
func gpubootEvent(st agentv1.EnrollmentState) (event, bool) {
	switch st {
	case registering:
		return evRegistering, true
	case waiting:
		return evWaitingApproval, true
	case approved:
		return evApproved, true
	case rejected:
		return evRejected, true
	case conflict:
		return evConflict, true
	case failed:
		return evRefused, true
	}
	return 0, false
}

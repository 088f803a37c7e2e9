package node

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
)

// enrollState is the agent's enrollment status, updated by enrollment and the join.
type enrollState struct {
	mu sync.Mutex
	st *agentv1.EnrollmentStatus
}

func (e *enrollState) get() *agentv1.EnrollmentStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return proto.Clone(e.st).(*agentv1.EnrollmentStatus)
}

// move applies ev to the state (the lifecycle table, next) with msg as the new
// message, and returns the states before and after. An illegal event changes nothing.
func (e *enrollState) move(ev event, msg string) (from, to agentv1.EnrollmentState, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	from = e.st.State
	if to, err = next(from, ev); err != nil {
		return from, from, err
	}
	if from != to {
		e.st.Since = timestamppb.Now()
	}
	e.st.State, e.st.Message = to, msg
	return from, to, nil
}

// update sets the fields of gpuboot's answers; empty values leave a field as it is.
func (e *enrollState) update(machineState, fingerprint string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if machineState != "" {
		e.st.MachineState = machineState
	}
	if fingerprint != "" {
		e.st.KeyFingerprint = fingerprint
	}
}

func (e *enrollState) state() agentv1.EnrollmentState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st.State
}

// joinService enrolls with gpuboot (or takes the JoinBundle given at start), joins
// Kubernetes, reports commissioning and then keeps GPUHealthy (and, simulated, the
// node Lease) until it stops. Its status is the enrollment's.
type joinService struct {
	n *node
}

func (j *joinService) Name() string { return "join" }

func (j *joinService) Status() ServiceStatus {
	st := j.n.enrollment.get()
	state := Running
	if st.GetState() == failed {
		state = Failed
	}
	return ServiceStatus{State: state, Message: st.GetState().String() + ": " + st.GetMessage(), Since: st.GetSince().AsTime()}
}

func (j *joinService) Run(ctx context.Context) error {
	n := j.n
	switch {
	case n.cfg.Bundle != nil:
		n.join(ctx, n.cfg.Bundle, nil)
	case n.cfg.Enroll != nil:
		n.enrollAndJoin(ctx, *n.cfg.Enroll)
	}
	return nil
}

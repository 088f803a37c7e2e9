// Package server is the agent's API surface: gpurack.agent.v1.AgentService over gRPC
// (with grpc.health.v1 and server reflection, so grpcurl needs no .proto files) and
// Prometheus metrics. It reads the monitor's state and turns requests into monitor and
// simulator calls; it decides nothing about health itself.
package server

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/protoconv"
	"github.com/gpurack/gpurack/agent/xid"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

// FaultInjector is the simulator's fault API (agent/gpu/sim.Sim).
type FaultInjector interface {
	Inject(f sim.Fault, d time.Duration) (string, error)
	Clear(ids ...string) int
	Active() []sim.ActiveFault
}

// Monitor is what the API reads and drives: agent/monitor.Monitor.
type Monitor interface {
	StateReader
	RunChecks(phase monitor.Phase, ids ...checkid.ID) *monitor.Checklist
	Broker() *monitor.Broker
	Kick()
	GPUsReset(gpus []int)
}

// StateReader is the monitor's state as the API and the metrics read it.
type StateReader interface {
	Backend() gpu.Backend
	Profile() *profile.Profile
	Health() health.Summary
	Last() *monitor.Checklist
	Results() []checks.Result
	XIDs() *xid.Tracker
}

// Service implements AgentService.
type Service struct {
	agentv1.UnimplementedAgentServiceServer

	Monitor Monitor
	// Faults is the simulator, or nil on real GPUs.
	Faults    FaultInjector
	Identity  facts.Identity
	ImageID   string
	Version   string
	StartedAt time.Time
	// NodeName returns the node name; empty before a JoinBundle.
	NodeName func() string
	// Rack returns the gossip rack view, or nil without gossip.
	Rack func() *agentv1.RackView
	// Enrollment returns the enrollment status.
	Enrollment func() *agentv1.EnrollmentStatus
	// DataDisks returns the local disks as last looked at, or nil before the first look.
	DataDisks func() *machinev1.DataDisks
}

func (s *Service) nodeName() string {
	if s.NodeName == nil {
		return ""
	}
	return s.NodeName()
}

// Status returns the agent's state; it runs no checks.
func (s *Service) Status(context.Context, *agentv1.StatusRequest) (*agentv1.StatusResponse, error) {
	m := s.Monitor
	b := m.Backend()
	out := &agentv1.StatusResponse{
		NodeName: s.nodeName(), ImageId: s.ImageID, Backend: b.Name(), Simulated: b.Simulated(),
		AgentVersion: s.Version, StartedAt: timestamppb.New(s.StartedAt), Identity: protoconv.Identity(s.Identity),
		Health: protoconv.Health(m.Health()),
	}
	if last := m.Last(); last != nil {
		out.DriverVersion = last.Snapshot.Driver.Version
		out.LastChecklist = protoconv.Checklist(last, s.Identity, s.ImageID, out.NodeName)
	}
	if s.Enrollment != nil {
		out.Enrollment = s.Enrollment()
	}
	if s.Rack != nil {
		out.Rack = s.Rack()
	}
	if s.DataDisks != nil {
		out.DataDisks = s.DataDisks()
	}
	if s.Faults != nil {
		for _, a := range s.Faults.Active() {
			af := &agentv1.ActiveFault{FaultId: a.ID, Fault: faultSpec(a.Fault, 0), InjectedAt: timestamppb.New(a.InjectedAt)}
			if !a.ExpiresAt.IsZero() {
				af.ExpiresAt = timestamppb.New(a.ExpiresAt)
				af.Fault.Duration = durationpb.New(a.ExpiresAt.Sub(a.InjectedAt))
			}
			out.ActiveFaults = append(out.ActiveFaults, af)
		}
	}
	return out, nil
}

// ListGPUs reads the GPUs now and joins them with their latest results.
func (s *Service) ListGPUs(context.Context, *agentv1.ListGPUsRequest) (*agentv1.ListGPUsResponse, error) {
	snap := gpu.Read(s.Monitor.Backend())
	if !snap.Driver.Loaded {
		return nil, status.Error(codes.Unavailable, snap.Driver.Error)
	}
	results := s.Monitor.Results()
	now := time.Now()
	recent := s.Monitor.XIDs().Recent(now, checks.RecentXIDWindow)
	out := &agentv1.ListGPUsResponse{}
	at := timestamppb.New(snap.TakenAt)
	for i := range snap.GPUs {
		g := &snap.GPUs[i]
		st := &agentv1.GPUState{Gpu: protoconv.GPU(g), Healthy: true, TemperatureC: int32(g.TemperatureC.V),
			PowerMw: g.PowerMW.V, MemoryUsedMib: g.MemoryUsedMiB.V, UtilizationPercent: g.UtilizationPct.V}
		for _, r := range results {
			if r.GPU != g.Index {
				continue
			}
			if r.Status == checks.Fail {
				st.Healthy = false
			}
			st.Results = append(st.Results, protoconv.Result(r, at))
		}
		for _, e := range recent {
			if e.GPU == g.Index {
				st.RecentXids = append(st.RecentXids, protoconv.XID(e))
			}
		}
		out.Gpus = append(out.Gpus, st)
	}
	return out, nil
}

// RunChecks runs the checklist now.
func (s *Service) RunChecks(_ context.Context, req *agentv1.RunChecksRequest) (*agentv1.RunChecksResponse, error) {
	var ids []checkid.ID
	for _, id := range req.GetCheckIds() {
		if !checkid.Known(id) {
			return nil, status.Errorf(codes.InvalidArgument, "unknown check id %q", id)
		}
		ids = append(ids, checkid.ID(id))
	}
	if req.GetReport() {
		return nil, status.Error(codes.FailedPrecondition, "report needs an enrolled agent; this agent is not enrolled with gpuboot")
	}
	phase := monitor.PhaseContinuous
	switch req.GetPhase() {
	case machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING:
		phase = monitor.PhaseCommissioning
	case machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL:
		phase = monitor.PhasePreApproval
	}
	cl := s.Monitor.RunChecks(phase, ids...)
	return &agentv1.RunChecksResponse{
		Checklist: protoconv.Checklist(cl, s.Identity, s.ImageID, s.nodeName()),
		Health:    protoconv.Health(s.Monitor.Health()),
	}, nil
}

// WatchEvents streams events until the client cancels or falls behind.
func (s *Service) WatchEvents(req *agentv1.WatchEventsRequest, stream agentv1.AgentService_WatchEventsServer) error {
	want := func(k agentv1.EventKind) bool { return len(req.GetKinds()) == 0 || slices.Contains(req.GetKinds(), k) }
	sub := s.Monitor.Broker().Subscribe()
	defer sub.Close()
	var seq uint64
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-sub.Overflowed:
			return status.Errorf(codes.ResourceExhausted, "client fell more than %d events behind; call Status and watch again", monitor.SubscriberBuffer)
		case e, ok := <-sub.C:
			if !ok {
				select {
				case <-sub.Overflowed:
					return status.Errorf(codes.ResourceExhausted, "client fell more than %d events behind; call Status and watch again", monitor.SubscriberBuffer)
				default:
					return nil
				}
			}
			kind, ev := s.render(e)
			if ev == nil || !want(kind) {
				continue
			}
			seq++
			ev.Sequence, ev.NodeName = seq, s.nodeName()
			if ev.Time == nil {
				ev.Time = timestamppb.New(e.Time)
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

func (s *Service) render(e monitor.Event) (agentv1.EventKind, *agentv1.Event) {
	switch {
	case e.Health != nil:
		hc := &agentv1.HealthChanged{Current: protoconv.Health(e.Health.Current)}
		if e.Health.Previous != nil {
			hc.Previous = protoconv.Health(*e.Health.Previous)
		}
		return agentv1.EventKind_EVENT_KIND_HEALTH, &agentv1.Event{Payload: &agentv1.Event_HealthChanged{HealthChanged: hc}}
	case e.XID != nil:
		return agentv1.EventKind_EVENT_KIND_XID, &agentv1.Event{Time: timestamppb.New(e.XID.At), Payload: &agentv1.Event_Xid{Xid: protoconv.XID(*e.XID)}}
	case e.Check != nil:
		at := timestamppb.New(e.Time)
		cc := &agentv1.CheckResultChanged{Current: protoconv.Result(e.Check.Current, at)}
		if e.Check.Previous != nil {
			cc.Previous = protoconv.Result(*e.Check.Previous, at)
		}
		return agentv1.EventKind_EVENT_KIND_CHECK_RESULT, &agentv1.Event{Payload: &agentv1.Event_CheckResultChanged{CheckResultChanged: cc}}
	case e.Member != nil:
		return agentv1.EventKind_EVENT_KIND_GOSSIP_MEMBER, memberChanged(e.Member, s.Monitor.Health())
	}
	return 0, nil
}

// InjectFault applies a simulator fault. XIDs (and lost GPUs) come back through the
// agent's NVML event watch, as on real GPUs.
func (s *Service) InjectFault(_ context.Context, req *agentv1.InjectFaultRequest) (*agentv1.InjectFaultResponse, error) {
	if s.Faults == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "fault injection needs the simulator backend; this agent runs %s", s.Monitor.Backend().Name())
	}
	f, d, err := parseFaultSpec(req.GetFault())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := s.Faults.Inject(f, d)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// An XID reaches the monitor the way a real one does: the simulator puts it on the
	// NVML event sets, and the agent's event watch records it.
	s.Monitor.Kick()
	return &agentv1.InjectFaultResponse{FaultId: id, Fault: faultSpec(f, d)}, nil
}

// ClearFaults removes simulator faults; the simulated GPUs count as reset.
func (s *Service) ClearFaults(_ context.Context, req *agentv1.ClearFaultsRequest) (*agentv1.ClearFaultsResponse, error) {
	if s.Faults == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "fault injection needs the simulator backend; this agent runs %s", s.Monitor.Backend().Name())
	}
	var gpus []int
	for _, a := range s.Faults.Active() {
		if (len(req.GetFaultIds()) == 0 || slices.Contains(req.GetFaultIds(), a.ID)) && a.Fault.GPU >= 0 {
			gpus = append(gpus, a.Fault.GPU)
		}
	}
	if len(req.GetFaultIds()) == 0 {
		// Clearing everything repairs every GPU, including XIDs injected on their own.
		gpus = gpus[:0]
		for i := 0; i < 64; i++ {
			gpus = append(gpus, i)
		}
	}
	n := s.Faults.Clear(req.GetFaultIds()...)
	s.Monitor.GPUsReset(gpus)
	return &agentv1.ClearFaultsResponse{Cleared: uint32(n)}, nil
}

// parseFaultSpec reads the text and/or structured form; both must agree.
func parseFaultSpec(fs *agentv1.FaultSpec) (sim.Fault, time.Duration, error) {
	if fs == nil {
		return sim.Fault{}, 0, fmt.Errorf("fault is required")
	}
	d := fs.GetDuration().AsDuration()
	if fs.GetDuration() != nil && d < 0 {
		return sim.Fault{}, 0, fmt.Errorf("duration %v is negative", d)
	}
	var structured *sim.Fault
	if fs.GetKind() != agentv1.FaultKind_FAULT_KIND_UNSPECIFIED {
		f := sim.Fault{Kind: sim.Kind(fs.GetKind()), GPU: -1, Value: fs.GetValue()}
		if fs.GpuIndex != nil {
			f.GPU = int(fs.GetGpuIndex())
		}
		// Validate through the text form, so both forms get the same checks.
		text := f.String()
		if f.Kind.NodeLevel() != (fs.GpuIndex == nil) || (!f.Kind.TakesValue() && f.Value != 0) {
			return sim.Fault{}, 0, fmt.Errorf("fault kind %s: gpu_index set %v and value %d do not fit KIND[:VALUE][@gpuN]", f.Kind, fs.GpuIndex != nil, f.Value)
		}
		parsed, err := sim.ParseFault(text)
		if err != nil {
			return sim.Fault{}, 0, err
		}
		structured = &parsed
	}
	if fs.GetSpec() == "" {
		if structured == nil {
			return sim.Fault{}, 0, fmt.Errorf("fault needs spec (e.g. \"xid:79@gpu3\") or kind")
		}
		return *structured, d, nil
	}
	f, err := sim.ParseFault(fs.GetSpec())
	if err != nil {
		return sim.Fault{}, 0, err
	}
	if structured != nil && *structured != f {
		return sim.Fault{}, 0, fmt.Errorf("spec %q and the structured fields (%s) disagree", fs.GetSpec(), structured)
	}
	return f, d, nil
}

// faultSpec fills both forms.
func faultSpec(f sim.Fault, d time.Duration) *agentv1.FaultSpec {
	out := &agentv1.FaultSpec{Spec: f.String(), Value: f.Value}
	if f.Kind <= sim.KindDriverUnloaded {
		out.Kind = agentv1.FaultKind(f.Kind)
	}
	if !f.Kind.NodeLevel() {
		i := int32(f.GPU)
		out.GpuIndex = &i
	}
	if d > 0 {
		out.Duration = durationpb.New(d)
	}
	return out
}

package admin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/rollout"
)

// Rollouts runs image rollouts; pxe/rollout.Controller implements it.
type Rollouts interface {
	Start(ctx context.Context, spec rollout.Spec) (*rollout.Rollout, error)
	Get(id string) (*rollout.Rollout, error)
	Pause(id, actor, reason string) (*rollout.Rollout, error)
	Resume(id, actor, reason string) (*rollout.Rollout, error)
	Rollback(id, actor, reason string) (*rollout.Rollout, error)
	Release(ctx context.Context, id string, force bool, actor, reason string) (*rollout.Rollout, []rollout.Released, error)
}

// StartRollout implements AdminService.
func (s *Server) StartRollout(ctx context.Context, req *bootv1.StartRolloutRequest) (*bootv1.Rollout, error) {
	op, err := s.operator(ctx, bootv1.AdminService_StartRollout_FullMethodName)
	if err != nil {
		return nil, err
	}
	if s.roll == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot runs no rollouts")
	}
	return rolloutAnswer(s.roll.Start(ctx, rolloutSpec(req, "operator:"+op.Name)))
}

// GetRollout implements AdminService.
func (s *Server) GetRollout(ctx context.Context, req *bootv1.GetRolloutRequest) (*bootv1.Rollout, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_GetRollout_FullMethodName); err != nil {
		return nil, err
	}
	if s.roll == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot runs no rollouts")
	}
	return rolloutAnswer(s.roll.Get(req.GetId()))
}

// PauseRollout implements AdminService.
func (s *Server) PauseRollout(ctx context.Context, req *bootv1.RolloutActionRequest) (*bootv1.Rollout, error) {
	return s.rolloutAction(ctx, bootv1.AdminService_PauseRollout_FullMethodName, req, Rollouts.Pause)
}

// ResumeRollout implements AdminService.
func (s *Server) ResumeRollout(ctx context.Context, req *bootv1.RolloutActionRequest) (*bootv1.Rollout, error) {
	return s.rolloutAction(ctx, bootv1.AdminService_ResumeRollout_FullMethodName, req, Rollouts.Resume)
}

// RollbackRollout implements AdminService.
func (s *Server) RollbackRollout(ctx context.Context, req *bootv1.RolloutActionRequest) (*bootv1.Rollout, error) {
	return s.rolloutAction(ctx, bootv1.AdminService_RollbackRollout_FullMethodName, req, Rollouts.Rollback)
}

// ReleaseRollout implements AdminService.
func (s *Server) ReleaseRollout(ctx context.Context, req *bootv1.ReleaseRolloutRequest) (*bootv1.ReleaseRolloutResponse, error) {
	op, err := s.operator(ctx, bootv1.AdminService_ReleaseRollout_FullMethodName)
	if err != nil {
		return nil, err
	}
	if s.roll == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot runs no rollouts")
	}
	r, rel, err := s.roll.Release(ctx, req.GetId(), req.GetForce(), "operator:"+op.Name, req.GetReason())
	if r == nil {
		_, err = rolloutAnswer(nil, err)
		return nil, err
	}
	resp := &bootv1.ReleaseRolloutResponse{RolloutId: r.ID}
	for _, x := range rel {
		resp.Machines = append(resp.Machines, &bootv1.PinRelease{MachineId: x.Machine, NodeName: x.Node, PinnedImageId: x.Pinned,
			NextImageId: x.Next, Released: x.Released, Message: x.Why})
	}
	if err != nil { // part-way: what was released stays released
		return nil, status.Errorf(codes.Internal, "%v (released before it: %d machines)", err, len(resp.Machines))
	}
	return resp, nil
}

func (s *Server) rolloutAction(ctx context.Context, method string, req *bootv1.RolloutActionRequest,
	do func(Rollouts, string, string, string) (*rollout.Rollout, error)) (*bootv1.Rollout, error) {
	op, err := s.operator(ctx, method)
	if err != nil {
		return nil, err
	}
	if s.roll == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot runs no rollouts")
	}
	return rolloutAnswer(do(s.roll, req.GetId(), "operator:"+op.Name, req.GetReason()))
}

// rolloutAnswer converts a rollout call's result for the API.
func rolloutAnswer(r *rollout.Rollout, err error) (*bootv1.Rollout, error) {
	switch {
	case err == nil:
		return rolloutProto(r), nil
	case errors.Is(err, rollout.ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, rollout.ErrPrecondition):
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, rollout.ErrNotFound):
		return nil, status.Error(codes.NotFound, err.Error())
	}
	return nil, grpcError(err)
}

// rolloutProto converts a rollout for the API (AdminService's Rollout).
func rolloutProto(r *rollout.Rollout) *bootv1.Rollout {
	p := &bootv1.Rollout{Id: r.ID, ImageId: r.Image, State: r.State, Reason: r.Reason, Actor: r.Actor,
		StartedAt: ts(r.StartedAt), EndedAt: ts(r.EndedAt), Canary: int32(r.Canary), BatchSize: int32(r.BatchSize),
		MaxUnavailable: int32(r.MaxUnavailable), NodeTimeout: durationpb.New(r.NodeTimeout), DrainTimeout: durationpb.New(r.DrainTimeout),
		Match: r.Match}
	for _, s := range r.Machines {
		p.Machines = append(p.Machines, &bootv1.RolloutMachine{MachineId: s.Machine, NodeName: s.Node, Batch: int32(s.Batch),
			PreviousImageId: s.Previous, TargetImageId: s.Target, Phase: s.Phase, StartedAt: ts(s.StartedAt), CycledAt: ts(s.CycledAt),
			ReadyAt: ts(s.ReadyAt), Message: s.Message})
	}
	return p
}

// rolloutSpec is the Spec of a StartRolloutRequest, with actor.
func rolloutSpec(req *bootv1.StartRolloutRequest, actor string) rollout.Spec {
	return rollout.Spec{Image: req.GetImageId(), Match: req.GetMatch(), Machines: req.GetMachines(), Canary: int(req.GetCanary()),
		BatchSize: int(req.GetBatchSize()), MaxUnavailable: int(req.GetMaxUnavailable()), NodeTimeout: req.GetNodeTimeout().AsDuration(),
		DrainTimeout: req.GetDrainTimeout().AsDuration(), Actor: actor, Reason: req.GetReason()}
}

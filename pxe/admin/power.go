package admin

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/bmc"
)

// powerActions maps the API's PowerAction to pxe/bmc's.
var powerActions = map[bootv1.PowerAction]bmc.Action{
	bootv1.PowerAction_POWER_ACTION_ON:     bmc.ActionOn,
	bootv1.PowerAction_POWER_ACTION_OFF:    bmc.ActionOff,
	bootv1.PowerAction_POWER_ACTION_CYCLE:  bmc.ActionCycle,
	bootv1.PowerAction_POWER_ACTION_STATUS: bmc.ActionStatus,
}

// PowerActionProto is the API's PowerAction for a; UNSPECIFIED for none.
func PowerActionProto(a bmc.Action) bootv1.PowerAction {
	for p, x := range powerActions {
		if x == a {
			return p
		}
	}
	return bootv1.PowerAction_POWER_ACTION_UNSPECIFIED
}

// PowerMachine implements AdminService.
func (s *Server) PowerMachine(ctx context.Context, req *bootv1.PowerMachineRequest) (*bootv1.PowerMachineResponse, error) {
	op, err := s.operator(ctx, bootv1.AdminService_PowerMachine_FullMethodName)
	if err != nil {
		return nil, err
	}
	action, ok := powerActions[req.GetAction()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "action %s: give on, off, cycle or status", req.GetAction())
	}
	m, res, err := s.life.PowerMachine(ctx, req.GetMachine(), action, "operator:"+op.Name, req.GetReason())
	if err != nil {
		return nil, powerError(err)
	}
	return powerResponse(m.ID, res), nil
}

// powerError maps an error of a power action to its gRPC code (admin.proto,
// PowerMachine): the BMC's by its kind, the rest as every lifecycle error.
func powerError(err error) error {
	var code codes.Code
	switch bmc.KindOf(err) {
	case bmc.KindUnreachable:
		code = codes.Unavailable
	case bmc.KindTimeout:
		code = codes.DeadlineExceeded
	case bmc.KindFailed:
		code = codes.Aborted
	case bmc.KindCredentials, bmc.KindUnsupported, bmc.KindNotFound, bmc.KindInvalid:
		code = codes.FailedPrecondition
	default:
		return grpcError(err)
	}
	return status.Error(code, err.Error())
}

// powerResponse is what the API returns for a power action on machine id.
func powerResponse(id string, res bmc.Result) *bootv1.PowerMachineResponse {
	p := &bootv1.PowerMachineResponse{MachineId: id, Bmc: res.Address, System: res.System,
		PowerStateBefore: string(res.Before), PowerState: string(res.PowerState), Elapsed: durationpb.New(res.Elapsed)}
	for _, r := range res.Resets {
		p.Resets = append(p.Resets, &bootv1.PowerReset{ResetType: r.ResetType, HttpStatus: int32(r.HTTPStatus), Task: r.Task,
			TaskState: r.TaskState, TaskMessages: r.TaskMessages, ExpectedPowerState: string(r.Expect), Reached: r.Reached})
	}
	return p
}

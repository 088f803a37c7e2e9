package admin

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/graphs"
)

// levels is the one table of what each operator call needs (pki.OperatorLevel): every
// AdminService method by its full gRPC name, every REST and rack-view route by its
// Handler pattern. A call not in the table is refused whatever the caller's level, so
// a new method or route cannot be reached until it is given a level here.
var levels = map[string]pki.OperatorLevel{
	// Reads.
	bootv1.AdminService_ListMachines_FullMethodName:       pki.LevelViewer,
	bootv1.AdminService_GetMachine_FullMethodName:         pki.LevelViewer,
	bootv1.AdminService_History_FullMethodName:            pki.LevelViewer,
	bootv1.AdminService_RackReport_FullMethodName:         pki.LevelViewer,
	bootv1.AdminService_GetGossipKeyStatus_FullMethodName: pki.LevelViewer,
	bootv1.AdminService_GetRollout_FullMethodName:         pki.LevelViewer,
	routeMachines:       pki.LevelViewer,
	routeMachine:        pki.LevelViewer,
	routeMachineHistory: pki.LevelViewer,
	routeHistory:        pki.LevelViewer,
	routeReport:         pki.LevelViewer,
	routeRackView:       pki.LevelViewer,
	routeIndex:          pki.LevelViewer,
	routeGraphs:         pki.LevelViewer,
	routeGraphsData:     pki.LevelViewer,

	// Decisions on machines and the racks' keys.
	bootv1.AdminService_Approve_FullMethodName:         pki.LevelOperator,
	bootv1.AdminService_Reject_FullMethodName:          pki.LevelOperator,
	bootv1.AdminService_Decommission_FullMethodName:    pki.LevelOperator,
	bootv1.AdminService_ResolveConflict_FullMethodName: pki.LevelOperator,
	bootv1.AdminService_RotateGossipKey_FullMethodName: pki.LevelOperator,
	bootv1.AdminService_WipeDataDisk_FullMethodName:    pki.LevelOperator,
	bootv1.AdminService_PowerMachine_FullMethodName:    pki.LevelOperator,
	bootv1.AdminService_StartRollout_FullMethodName:    pki.LevelOperator,
	bootv1.AdminService_PauseRollout_FullMethodName:    pki.LevelOperator,
	bootv1.AdminService_ResumeRollout_FullMethodName:   pki.LevelOperator,
	bootv1.AdminService_RollbackRollout_FullMethodName: pki.LevelOperator,
	bootv1.AdminService_ReleaseRollout_FullMethodName:  pki.LevelOperator,

	// Alertmanager's notifications: its own level, which reaches nothing else.
	routeAlerts: pki.LevelAlertSender,

	// The metrics server's scrape of gpuboot: its own level, which reaches nothing else.
	routeMetrics: pki.LevelMetricsReader,

	// Operators' credentials.
	bootv1.AdminService_RevokeOperator_FullMethodName:    pki.LevelAdmin,
	bootv1.AdminService_ListOperatorAudit_FullMethodName: pki.LevelAdmin,
}

// The Handler's routes, as registered (and as keyed in levels).
const (
	routeMachines       = "GET /api/v1/machines"
	routeMachine        = "GET /api/v1/machines/{ref}"
	routeMachineHistory = "GET /api/v1/machines/{ref}/history"
	routeHistory        = "GET /api/v1/history"
	routeReport         = "GET /api/v1/racks/{rack}/report"
	routeRackView       = "GET /racks/{rack}"
	routeIndex          = "GET /{$}"
	routeAlerts         = "POST /api/v1/alerts"
	routeMetrics        = "GET /metrics"
	routeGraphs         = "GET /graphs"
	routeGraphsData     = "GET " + graphs.DataPath
)

// tokenLevel is what a bearer token may do. Tokens reach only the REST API and the
// rack view (AdminService takes client certificates only), so they read: a token is a
// viewer's credential whatever the level of its operator's certificate, and a route
// that changes something (POST /api/v1/alerts, alert-sender) is closed to tokens by
// its level, and so is GET /metrics (metrics-reader).
const tokenLevel = pki.LevelViewer

// Caller is an authenticated operator: its name (the certificate's CN, or the token
// file's NAME) and its level.
type Caller struct {
	Name  string
	Level pki.OperatorLevel
}

// allow checks that c may make call (a levels key). The refusal names the level the
// call needs and how to get it.
func (c Caller) allow(call string) error {
	need, ok := levels[call]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s has no operator level in gpuboot's table, so no operator may call it (a gpuboot bug: report it)", call)
	}
	if !c.Level.Allows(need) {
		have := c.Level.Name()
		if have == "" {
			have = "no"
		}
		return status.Errorf(codes.PermissionDenied, "%s needs operator level %s; operator %s has %s level: ask an admin to issue you a certificate with `gpuboot certs operator %s --level %s`",
			call, need.Name(), c.Name, have, c.Name, need.Name())
	}
	return nil
}

// operator authenticates the gRPC caller (an operator client certificate) and checks
// its level against method's (a full gRPC method name).
func (s *Server) operator(ctx context.Context, method string) (Caller, error) {
	c, err := s.operatorCert(ctx)
	if err != nil {
		return Caller{}, err
	}
	return c, c.allow(method)
}

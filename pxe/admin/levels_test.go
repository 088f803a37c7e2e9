package admin

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestLevelsCoverEveryCall: every AdminService method has a level in the one table, so
// none is reachable by default or refused by mistake; a call the table does not name
// is refused even to an admin.
func TestLevelsCoverEveryCall(t *testing.T) {
	for _, m := range bootv1.AdminService_ServiceDesc.Methods {
		full := "/" + bootv1.AdminService_ServiceDesc.ServiceName + "/" + m.MethodName
		if _, ok := levels[full]; !ok {
			t.Errorf("AdminService method %s has no operator level in levels", full)
		}
	}
	admin := Caller{Name: "root", Level: pki.LevelAdmin}
	if err := admin.allow("/gpurack.boot.v1.AdminService/DropEverything"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an admin calling a method not in the table: %v; want PermissionDenied", err)
	}
	if err := admin.allow("POST /api/v1/machines"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an admin on a route not in the table: %v; want PermissionDenied", err)
	}
}

// TestLevelRefusals: each level reaches what it needs and no more; the refusal names
// the level needed and the command that issues it. A certificate naming two levels has
// none and reaches nothing.
func TestLevelRefusals(t *testing.T) {
	approve := bootv1.AdminService_Approve_FullMethodName
	revoke := bootv1.AdminService_RevokeOperator_FullMethodName
	list := bootv1.AdminService_ListMachines_FullMethodName
	for _, tt := range []struct {
		level pki.OperatorLevel
		call  string
		ok    bool
	}{
		{pki.LevelViewer, list, true},
		{pki.LevelViewer, routeRackView, true},
		{pki.LevelViewer, approve, false},
		{pki.LevelViewer, revoke, false},
		{pki.LevelViewer, bootv1.AdminService_WipeDataDisk_FullMethodName, false},
		{pki.LevelOperator, bootv1.AdminService_WipeDataDisk_FullMethodName, true},
		{pki.LevelViewer, bootv1.AdminService_PowerMachine_FullMethodName, false},
		{pki.LevelOperator, bootv1.AdminService_PowerMachine_FullMethodName, true},
		{pki.LevelOperator, approve, true},
		{pki.LevelOperator, bootv1.AdminService_RotateGossipKey_FullMethodName, true},
		{pki.LevelOperator, revoke, false},
		{pki.LevelOperator, bootv1.AdminService_ListOperatorAudit_FullMethodName, false},
		{pki.LevelAdmin, revoke, true},
		{pki.LevelAdmin, list, true},
		{"", list, false},
		{pki.LevelAlertSender, routeAlerts, true},
		{pki.LevelAlertSender, list, false},
		{pki.LevelAlertSender, routeReport, false},
		{pki.LevelViewer, routeAlerts, false},
		{pki.LevelOperator, routeAlerts, false},
		{pki.LevelAdmin, routeAlerts, false},
	} {
		err := Caller{Name: "bob", Level: tt.level}.allow(tt.call)
		if tt.ok != (err == nil) {
			t.Errorf("level %q calling %s: %v; want allowed=%v", tt.level, tt.call, err, tt.ok)
			continue
		}
		if err == nil {
			continue
		}
		need := levels[tt.call].Name()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "needs operator level "+need) ||
			!strings.Contains(err.Error(), "gpuboot certs operator bob --level "+need) {
			t.Errorf("level %q calling %s: refusal %v; want PermissionDenied naming level %s and how to get it", tt.level, tt.call, err, need)
		}
	}
}

package admin

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// TestWipeDataDiskOverEnrollment runs WipeDataDisk through the operator surface over the
// real enrollment service and a bbolt inventory: a viewer may not ask for a wipe; an
// operator's request with a wrong serial is FAILED_PRECONDITION; one that passes comes
// back as the machine with its pending wipe, and GetMachine and History show the disks,
// the wipe and the recorded action.
func TestWipeDataDiskOverEnrollment(t *testing.T) {
	ctx := context.Background()
	ca, store, svc := overEnrollment(t, pki.NewRevocationList())
	srv, err := New(Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1"}})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := identity.New("52:54:00:00:00:51", "", "SN51")
	if _, err := svc.DecideBoot(ctx, id, netip.MustParseAddr("192.0.2.51")); err != nil {
		t.Fatal(err)
	}
	m, err := svc.Approve(ctx, id.MAC, enroll.ApproveOptions{Actor: "operator:test", Reason: "listed"})
	if err != nil {
		t.Fatal(err)
	}
	// The agent's report, as its heartbeat stores it (pxe/enroll tests the heartbeat).
	disks := &machinev1.DataDisks{Disks: []*machinev1.DataDisk{{Path: "/dev/sdb", Serial: "S-B", Model: "HGST", SizeBytes: 8 << 40,
		State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, Detail: "LVM2 physical volume"}}}
	raw, _ := proto.Marshal(disks)
	if _, err := store.Update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		m.DataDisks, m.DataDisksAt = raw, time.Now()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}

	viewer, _ := pki.IssueOperatorLevel(ca, "vera", pki.LevelViewer)
	operator, _ := pki.IssueOperatorLevel(ca, "olga", pki.LevelOperator)
	req := &bootv1.WipeDataDiskRequest{Machine: id.MAC, Path: "/dev/sdb", Serial: "S-B", Reason: "old LVM disk"}
	if _, err := srv.WipeDataDisk(asPeer(ctx, viewer.Cert), req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a viewer's wipe: %v; want PermissionDenied", err)
	}
	olga := asPeer(ctx, operator.Cert)
	wrong := proto.Clone(req).(*bootv1.WipeDataDiskRequest)
	wrong.Serial = "S-X"
	if _, err := srv.WipeDataDisk(olga, wrong); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a wrong serial: %v; want FailedPrecondition", err)
	}
	noReason := proto.Clone(req).(*bootv1.WipeDataDiskRequest)
	noReason.Reason = ""
	if _, err := srv.WipeDataDisk(olga, noReason); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no reason: %v; want InvalidArgument", err)
	}
	got, err := srv.WipeDataDisk(olga, req)
	if err != nil || got.GetPendingWipe().GetPath() != "/dev/sdb" || got.GetPendingWipe().GetSerial() != "S-B" || got.GetPendingWipe().GetId() == "" {
		t.Fatalf("wipe: %v, %v", got.GetPendingWipe(), err)
	}
	if _, err := srv.WipeDataDisk(olga, req); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second wipe while one is pending: %v; want FailedPrecondition", err)
	}

	full, err := srv.GetMachine(asPeer(ctx, viewer.Cert), &bootv1.GetMachineRequest{Machine: id.MAC})
	if err != nil || !proto.Equal(full.GetDataDisks(), disks) || full.GetPendingWipe().GetId() != got.GetPendingWipe().GetId() {
		t.Fatalf("GetMachine: disks %v, pending %v, %v", full.GetDataDisks(), full.GetPendingWipe(), err)
	}
	h, err := srv.History(olga, &bootv1.HistoryRequest{Machine: id.MAC})
	if err != nil {
		t.Fatal(err)
	}
	last := h.Transitions[len(h.Transitions)-1]
	if last.Action != enroll.ActionWipeRequested || last.From != last.To || last.Actor != "operator:olga" || last.Reason != "/dev/sdb serial S-B: old LVM disk" {
		t.Fatalf("history ends with %v", last)
	}
}

package enroll

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// sampleDisks is what an agent reports: a refused disk and a failed one that may be
// wiped, this cluster's ready disk, one no rule selects, and a refused disk without
// a serial.
func sampleDisks() *machinev1.DataDisks {
	return &machinev1.DataDisks{ClusterFingerprint: "sha256:c1", Disks: []*machinev1.DataDisk{
		{Path: "/dev/nvme0n1", Serial: "S-N0", Model: "Samsung PM9A3", SizeBytes: 3840 << 30, State: machinev1.DataDiskState_DATA_DISK_STATE_READY,
			MountPoint: "/var/lib/gpurack/data/nvme0n1"},
		{Path: "/dev/sda", Serial: "S-A", State: machinev1.DataDiskState_DATA_DISK_STATE_NOT_SELECTED},
		{Path: "/dev/sdb", Serial: "S-B", State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, Detail: `ext4 filesystem (label "scratch")`},
		{Path: "/dev/sdc", Serial: "S-C", State: machinev1.DataDiskState_DATA_DISK_STATE_FAILED, Detail: "mkfs.xfs: exit status 1"},
		{Path: "/dev/sdd", State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, Detail: "LVM2 physical volume"},
	}}
}

// diskHeartbeat sends a heartbeat with disks and result over c (mutual TLS unless
// signed); signed heartbeats are signed with a's key.
func diskHeartbeat(t *testing.T, a *agent, c bootv1.EnrollmentServiceClient, signed bool, disks *machinev1.DataDisks, result *machinev1.DataDiskWipeResult) *bootv1.HeartbeatResponse {
	t.Helper()
	req := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, DataDisks: disks, WipeResult: result,
		Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true}}
	if signed {
		if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, a.e.clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := c.Heartbeat(context.Background(), req)
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	return resp
}

func storedDisks(t *testing.T, m *inventory.Machine) *machinev1.DataDisks {
	t.Helper()
	if m.DataDisksAt.IsZero() {
		return nil
	}
	d := new(machinev1.DataDisks)
	if err := proto.Unmarshal(m.DataDisks, d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestHeartbeatKeepsDataDisks: the machine's own agent's data disks are kept as the
// latest; a heartbeat without them leaves them; a registered machine's are not kept
// (anyone may register a key); reports over the bounds are refused with the bound named.
func TestHeartbeatKeepsDataDisks(t *testing.T) {
	e := newEnv(t, nil)
	const mac = "52:54:00:00:00:a1"
	a, mtls, _ := ready(e, mac)
	diskHeartbeat(t, a, mtls, false, sampleDisks(), nil)
	if got := storedDisks(t, e.machine(mac)); !proto.Equal(got, sampleDisks()) {
		t.Fatalf("kept %v, want %v", got, sampleDisks())
	}
	diskHeartbeat(t, a, mtls, false, nil, nil)
	if got := storedDisks(t, e.machine(mac)); !proto.Equal(got, sampleDisks()) {
		t.Fatalf("a heartbeat without disks changed them to %v", got)
	}

	stranger := e.agent("52:54:00:00:00:a2", "S-A2")
	stranger.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	diskHeartbeat(t, stranger, stranger.c, true, sampleDisks(), nil)
	if m := e.machine("52:54:00:00:00:a2"); !m.DataDisksAt.IsZero() {
		t.Fatal("a registered machine's data disks were kept")
	}

	many := &machinev1.DataDisks{}
	for range MaxDataDisks + 1 {
		many.Disks = append(many.Disks, &machinev1.DataDisk{Path: "/dev/x"})
	}
	_, err := mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, DataDisks: many})
	wantLimit(t, "257 disks", err, "MaxDataDisks")
	huge := &machinev1.DataDisks{Disks: []*machinev1.DataDisk{{Path: "/dev/x", Detail: strings.Repeat("d", MaxDataDisksBytes)}}}
	_, err = mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, DataDisks: huge})
	wantLimit(t, "64 KiB of disks", err, "MaxDataDisksBytes")
	long := &machinev1.DataDiskWipeResult{Id: "x", Error: strings.Repeat("e", MaxWipeErrorBytes+1)}
	_, err = mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, WipeResult: long})
	wantLimit(t, "a 4 KiB wipe error", err, "MaxWipeErrorBytes")
	if got := storedDisks(t, e.machine(mac)); !proto.Equal(got, sampleDisks()) {
		t.Fatalf("a refused heartbeat changed the disks to %v", got)
	}
}

// TestWipeDataDiskRefusals: each request gpuboot must not pass on is refused with the
// class and a reason that says what to do, and changes nothing.
func TestWipeDataDiskRefusals(t *testing.T) {
	e := newEnv(t, nil)
	const mac = "52:54:00:00:00:b1"
	a, mtls, _ := ready(e, mac)
	ctx := context.Background()
	if _, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdb", "S-B", "operator:alice", "old disk"); !errors.Is(err, ErrPrecondition) || !strings.Contains(err.Error(), "reported no disks") {
		t.Errorf("before the agent reported disks: %v; want ErrPrecondition", err)
	}
	diskHeartbeat(t, a, mtls, false, sampleDisks(), nil)
	for _, tt := range []struct {
		name, path, serial, reason string
		class                      error
		says                       string
	}{
		{"no reason", "/dev/sdb", "S-B", " ", ErrInvalid, "reason is required"},
		{"no path", "", "S-B", "r", ErrInvalid, "device path"},
		{"no serial", "/dev/sdb", "", "r", ErrInvalid, "serial is required"},
		{"wrong serial", "/dev/sdb", "S-X", "r", ErrPrecondition, `serial "S-X" does not match the serial the agent reported for /dev/sdb`},
		{"serial of another disk", "/dev/sdb", "S-C", "r", ErrPrecondition, "does not match"},
		{"unknown path", "/dev/sdz", "S-B", "r", ErrPrecondition, "has not reported a disk at /dev/sdz; it reported /dev/nvme0n1, /dev/sda, /dev/sdb, /dev/sdc, /dev/sdd"},
		{"ready disk", "/dev/nvme0n1", "S-N0", "r", ErrPrecondition, "decommissioning data"},
		{"disk no rule selects", "/dev/sda", "S-A", "r", ErrPrecondition, "storage.dataDisks"},
		{"disk without a serial", "/dev/sdd", "S-D", "r", ErrPrecondition, "no serial"},
		{"unknown machine", "/dev/sdb", "S-B", "r", inventory.ErrNotFound, ""},
	} {
		ref := mac
		if tt.class == inventory.ErrNotFound {
			ref = "52:54:00:00:00:ff"
		}
		_, err := e.svc.WipeDataDisk(ctx, ref, tt.path, tt.serial, "operator:alice", tt.reason)
		if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: %v; want %v saying %q", tt.name, err, tt.class, tt.says)
		}
		if err != nil && tt.serial == "S-X" && strings.Contains(err.Error(), "S-B") {
			t.Errorf("%s: the refusal hands over the disk's serial: %v", tt.name, err)
		}
	}
	if m := e.machine(mac); m.PendingWipe != nil {
		t.Fatalf("a refused request left a pending wipe: %+v", m.PendingWipe)
	}

	if _, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdb", "S-B", "operator:alice", "old scratch disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdc", "S-C", "operator:alice", "failed disk"); !errors.Is(err, ErrPrecondition) || !strings.Contains(err.Error(), "pending") {
		t.Errorf("a second wipe while one is pending: %v; want ErrPrecondition", err)
	}

	registered := e.agent("52:54:00:00:00:b2", "S-B2")
	registered.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if _, err := e.svc.WipeDataDisk(ctx, "52:54:00:00:00:b2", "/dev/sdb", "S-B", "operator:alice", "r"); !errors.Is(err, ErrPrecondition) || !strings.Contains(err.Error(), "is registered") {
		t.Errorf("a registered machine: %v; want ErrPrecondition naming its state", err)
	}
}

// TestWipeDataDiskThroughHeartbeats: an accepted wipe is recorded and carried by every
// heartbeat answer over mutual TLS (never a signed one) until the agent's result names
// it; a result naming another id is ignored; done and refused outcomes enter the
// history as the agent's actions, and the history stays a valid lifecycle.
func TestWipeDataDiskThroughHeartbeats(t *testing.T) {
	e := newEnv(t, nil)
	const mac = "52:54:00:00:00:c1"
	a, mtls, _ := ready(e, mac)
	ctx := context.Background()
	diskHeartbeat(t, a, mtls, false, sampleDisks(), nil)
	m, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdb", "S-B", "operator:alice", "old scratch disk")
	if err != nil {
		t.Fatal(err)
	}
	w := m.PendingWipe
	if w == nil || !strings.HasPrefix(w.ID, "wipe-") || w.Path != "/dev/sdb" || w.Serial != "S-B" || w.Actor != "operator:alice" || m.State != inventory.Ready {
		t.Fatalf("after the request: %s, pending %+v", m.State, w)
	}
	if r := diskHeartbeat(t, a, a.c, true, nil, nil); r.Wipe != nil {
		t.Fatalf("a signed heartbeat's answer carries the wipe: %v", r.Wipe)
	}
	want := &machinev1.DataDiskWipe{Id: w.ID, Path: "/dev/sdb", Serial: "S-B"}
	for i := range 2 {
		if r := diskHeartbeat(t, a, mtls, false, nil, nil); !proto.Equal(r.Wipe, want) {
			t.Fatalf("mTLS answer %d: wipe %v, want %v", i+1, r.Wipe, want)
		}
	}
	if r := diskHeartbeat(t, a, mtls, false, nil, &machinev1.DataDiskWipeResult{Id: "wipe-other", Wiped: true}); !proto.Equal(r.Wipe, want) {
		t.Fatalf("after a result for another id: wipe %v, want it still pending", r.Wipe)
	}
	if r := diskHeartbeat(t, a, mtls, false, nil, &machinev1.DataDiskWipeResult{Id: w.ID, Wiped: true}); r.Wipe != nil {
		t.Fatalf("the answer to the result still carries the wipe: %v", r.Wipe)
	}
	if m := e.machine(mac); m.PendingWipe != nil {
		t.Fatalf("pending after the result: %+v", m.PendingWipe)
	}

	if _, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdc", "S-C", "operator:bob", "retry the failed disk"); err != nil {
		t.Fatal(err)
	}
	id := e.machine(mac).PendingWipe.ID
	diskHeartbeat(t, a, mtls, false, nil, &machinev1.DataDiskWipeResult{Id: id, Error: "wipe /dev/sdc: open for writing: device or resource busy\n(is it mounted?)"})
	diskHeartbeat(t, a, mtls, false, nil, &machinev1.DataDiskWipeResult{Id: id, Wiped: true}) // repeated: ignored
	checkWipeHistory(t, e, mac, a.fp())
}

func checkWipeHistory(t *testing.T, e *env, mac, fp string) {
	t.Helper()
	e.checkHistory(mac)
	h, err := e.store.History(context.Background(), e.machine(mac).ID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tr := range h {
		if tr.Action != "" {
			if tr.From != inventory.Ready || tr.To != inventory.Ready {
				t.Errorf("action %q recorded as %s → %s", tr.Action, tr.From, tr.To)
			}
			got = append(got, tr.Action+" | "+tr.Actor+" | "+tr.Reason)
		}
	}
	want := []string{
		"wipe-data-disk requested | operator:alice | /dev/sdb serial S-B: old scratch disk",
		"wipe-data-disk done | agent:" + fp + " | /dev/sdb serial S-B wiped (asked by operator:alice)",
		"wipe-data-disk requested | operator:bob | /dev/sdc serial S-C: retry the failed disk",
		"wipe-data-disk refused | agent:" + fp + " | wipe /dev/sdc: open for writing: device or resource busy (is it mounted?)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("actions in the history:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestDecommissionDropsPendingWipe: a decommissioned machine's agent no longer calls
// over mutual TLS, so its pending wipe is dropped, and the history says so.
func TestDecommissionDropsPendingWipe(t *testing.T) {
	e := newEnv(t, nil)
	const mac = "52:54:00:00:00:d1"
	a, mtls, _ := ready(e, mac)
	diskHeartbeat(t, a, mtls, false, sampleDisks(), nil)
	ctx := context.Background()
	if _, err := e.svc.WipeDataDisk(ctx, mac, "/dev/sdb", "S-B", "operator:alice", "old disk"); err != nil {
		t.Fatal(err)
	}
	m, err := e.svc.Decommission(ctx, mac, "operator:alice", "retired")
	if m == nil {
		t.Fatal(err)
	}
	if m.PendingWipe != nil {
		t.Fatalf("pending after decommission: %+v", m.PendingWipe)
	}
	h, _ := e.store.History(ctx, m.ID)
	if last := h[len(h)-1]; last.To != inventory.Decommissioned || !strings.Contains(last.Reason, "pending wipe of /dev/sdb serial S-B is dropped") {
		t.Fatalf("decommission recorded as %+v", last)
	}
}

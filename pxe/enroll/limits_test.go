package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// wantLimit checks that err is ResourceExhausted and names the bound.
func wantLimit(t *testing.T, what string, err error, bound string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), bound) {
		t.Fatalf("%s: got %v, want ResourceExhausted naming %s", what, err, bound)
	}
}

// TestRegisterLimits: oversized facts and checklists are refused over a real gRPC
// connection, before anything is stored; a normal Register still works.
func TestRegisterLimits(t *testing.T) {
	e := newEnv(t, nil)
	big := e.agent("52:54:00:00:00:01", "S1")
	big.facts.Hostname = strings.Repeat("h", MaxFactsBytes)
	_, err := big.register()
	wantLimit(t, "facts of 64 KiB", err, "MaxFactsBytes")

	many := e.agent("52:54:00:00:00:02", "S2")
	for i := range MaxFactsGPUs + 1 {
		many.facts.Gpus = append(many.facts.Gpus, &machinev1.GPU{Index: int32(i)})
	}
	_, err = many.register()
	wantLimit(t, "65 GPUs", err, "MaxFactsGPUs")

	cl := e.agent("52:54:00:00:00:03", "S3")
	req := &bootv1.RegisterRequest{Facts: cl.facts, PublicKey: cl.key.Public().(ed25519.PublicKey),
		Checklist: &machinev1.Checklist{Results: make([]*machinev1.CheckResult, MaxChecklistResults+1)}}
	for i := range req.Checklist.Results {
		req.Checklist.Results[i] = &machinev1.CheckResult{Id: "x"}
	}
	if err := bootv1.SignRequest(cl.key, bootv1.EnrollmentService_Register_FullMethodName, req, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	_, err = cl.c.Register(context.Background(), req)
	wantLimit(t, "1025 check results", err, "MaxChecklistResults")

	all, err := e.store.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 0 {
		t.Fatalf("refused Registers stored %d machines", len(all))
	}
	e.agent("52:54:00:00:00:04", "S4").mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
}

// TestReportAndHeartbeatLimits: an approved agent's oversized report or health is
// refused with the bound named.
func TestReportAndHeartbeatLimits(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:05", "S5")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	req := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{
		Identity: a.facts.Identity, Phase: machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL,
		Results: []*machinev1.CheckResult{{Id: "x", Message: strings.Repeat("m", MaxChecklistBytes)}},
	}}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	_, err := a.c.ReportCommissioning(context.Background(), req)
	wantLimit(t, "report of 256 KiB", err, "MaxChecklistBytes")

	hb := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, Health: &machinev1.HealthSummary{
		FailingCheckIds: []string{strings.Repeat("f", MaxHealthBytes)}}}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Heartbeat_FullMethodName, hb, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	_, err = a.c.Heartbeat(context.Background(), hb)
	wantLimit(t, "health of 16 KiB", err, "MaxHealthBytes")
}

// TestJoinBundleRandomTokensLeaveNoLocks: GetJoinBundle calls with made-up token ids
// (properly signed, so they pass authentication) must not leave a per-machine lock
// behind each: that grew gpuboot's memory without bound.
func TestJoinBundleRandomTokensLeaveNoLocks(t *testing.T) {
	e := newEnv(t, nil)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	a := &agent{e: e, key: key, c: e.client()}
	for i := range 200 {
		b := make([]byte, 8)
		rand.Read(b)
		_, err := a.bundle(fmt.Sprintf("m%x.%d", b, i), make([]byte, bootv1.ChallengeSize))
		if status.Code(err) != codes.NotFound {
			t.Fatalf("random token: %v, want NotFound", err)
		}
	}
	n := 0
	e.svc.locks.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("200 GetJoinBundle calls with unknown token ids left %d per-machine locks", n)
	}
}

package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
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

// maximal makes a's Register carry facts and a checklist just under MaxFactsBytes and
// MaxChecklistBytes: the most one unauthenticated identity may store through it.
func maximal(a *agent) *machinev1.Checklist {
	a.facts.Gpus = nil
	for i := range MaxFactsGPUs {
		a.facts.Gpus = append(a.facts.Gpus, &machinev1.GPU{Index: int32(i), ProductName: strings.Repeat("x", MaxFactsBytes/MaxFactsGPUs-64)})
	}
	cl := &machinev1.Checklist{Identity: a.facts.Identity}
	for i := range MaxChecklistResults {
		cl.Results = append(cl.Results, &machinev1.CheckResult{Id: fmt.Sprint("check.", i), Message: strings.Repeat("y", MaxChecklistBytes/MaxChecklistResults-48)})
	}
	return cl
}

func (a *agent) registerWith(cl *machinev1.Checklist) (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: a.facts, Checklist: cl, PublicKey: a.key.Public().(ed25519.PublicKey)}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, a.e.clk.Now()); err != nil {
		a.e.t.Fatal(err)
	}
	return a.c.Register(context.Background(), req)
}

// TestUnapprovedBytesAreCapped performs issue 33's storage attack: strangers register
// the largest facts and checklists they may until the unapproved records hold
// MaxUnapprovedBytes. The next stranger is refused with ResourceExhausted naming the
// setting, and so is a stranger already stored that sends more; a bound machine's
// Register and Heartbeat still work; rejecting a stranger makes room. The count a
// restarted gpuboot makes from the store is the one kept.
func TestUnapprovedBytesAreCapped(t *testing.T) {
	const limit = 4 << 20
	e := newEnv(t, func(c *Config) { c.MaxUnapprovedBytes = limit })
	bound := e.agent("52:54:00:00:0b:01", "SN-BOUND")
	bound.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(bound.facts.Identity.BootMac)
	r := bound.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := bound.bundle(r.Token, r.Challenge)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	if err != nil {
		t.Fatal(err)
	}
	mtls := e.client(tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: bound.key, Leaf: cert})

	small := e.agent("52:54:00:00:0b:02", "SN-SMALL")
	small.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	stored := 0
	for i := 0; ; i++ {
		a := e.agent(fmt.Sprintf("52:54:00:00:0c:%02x", i), fmt.Sprint("SN-BIG-", i))
		_, err := a.registerWith(maximal(a))
		if err != nil {
			wantLimit(t, fmt.Sprintf("stranger %d past the byte cap", i), err, "enrollment.maxUnapprovedBytes")
			break
		}
		if stored++; stored > limit/(MaxFactsBytes+MaxChecklistBytes) {
			t.Fatalf("%d strangers of about %d kB each stored under a cap of %d bytes", stored, (MaxFactsBytes+MaxChecklistBytes)>>10, limit)
		}
	}
	if held := e.svc.unapprovedBytes; held > limit || held < limit-2*(MaxFactsBytes+MaxChecklistBytes) {
		t.Fatalf("unapproved records hold %d bytes counted, want just under %d", held, limit)
	}
	_, err = small.registerWith(maximal(small))
	wantLimit(t, "a stored stranger growing past the byte cap", err, "enrollment.maxUnapprovedBytes")

	if _, err := bound.heartbeat(mtls, false); err != nil {
		t.Fatalf("bound machine's heartbeat at the byte cap: %v", err)
	}
	if _, err := bound.registerWith(maximal(bound)); err != nil {
		t.Fatalf("bound machine's register with the largest facts at the byte cap: %v", err)
	}
	if _, err := e.svc.Reject(context.Background(), e.machine("52:54:00:00:0c:00").ID, "operator:test", "junk"); err != nil {
		t.Fatal(err)
	}
	late := e.agent("52:54:00:00:0d:01", "SN-LATE")
	if _, err := late.registerWith(maximal(late)); err != nil {
		t.Fatalf("stranger after a rejection made room: %v", err)
	}
	again, err := New(context.Background(), e.svc.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again.unapprovedBytes != e.svc.unapprovedBytes || again.unapproved != e.svc.unapproved {
		t.Fatalf("kept count %d records, %d bytes; counted from the store %d, %d", e.svc.unapproved, e.svc.unapprovedBytes, again.unapproved, again.unapprovedBytes)
	}
	t.Logf("%d strangers of the largest facts and checklist filled a cap of %d bytes; %d bytes held", stored, limit, e.svc.unapprovedBytes)
}

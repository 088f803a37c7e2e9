package server_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// hostileSerial is a serial a stranger sends that a markdown renderer would make an
// image and a link of.
const hostileSerial = "![x](http://evil.example/i.png)[serial](http://evil.example)"

// heartbeatHolding sends a signed heartbeat for a with an allocation of n GPUs to tenant.
func (a *testAgent) heartbeatHolding(ctx context.Context, c bootv1.EnrollmentServiceClient, tenant string, n int) error {
	alloc := &machinev1.GPUAllocation{}
	for i := range n {
		alloc.Holders = append(alloc.Holders, &machinev1.GPUHolder{GpuUuid: fmt.Sprintf("GPU-%s-%d", tenant, i), Namespace: tenant + "-ns", Pod: "p", Container: "c", Tenant: tenant})
	}
	req := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, GpuAllocation: alloc,
		Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY}}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, time.Now()); err != nil {
		return err
	}
	_, err := c.Heartbeat(ctx, req)
	return err
}

// TestStrangersCountNowhereInRackReport (issue 33, hole 1): against a real gpuboot
// serve, a stranger (its own key, a made-up identity, never approved) and a rejected
// machine send heartbeats that claim 8 GPUs for invented tenants. The rack report's
// "GPUs by tenant" shows only the bound, joining machine's tenant, in markdown and JSON.
func TestStrangersCountNowhereInRackReport(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	ctx := context.Background()
	c := in.enrollClient()

	// A real machine: approved, its bundle taken (joining), holding one GPU for alpha.
	real := newTestAgent(31)
	if r, err := real.register(ctx, c); err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
		t.Fatalf("register: %v %v", r, err)
	}
	in.cli("machines", "approve", real.facts.Identity.BootMac, "--slot", "U31")
	r, err := real.register(ctx, c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		t.Fatalf("register after approve: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(real.key, r.Challenge, r.Token)}
	bootv1.SignRequest(real.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	if _, err := c.GetJoinBundle(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := real.heartbeatHolding(ctx, c, "alpha", 1); err != nil {
		t.Fatalf("the joining machine's heartbeat: %v", err)
	}

	// A stranger: registered (pending), never approved. Its heartbeat authenticates
	// (its key is registered for the identity it made up) but its allocation must not
	// be kept.
	stranger := newTestAgent(32)
	// Its serial (printable ASCII, as SMBIOS allows) is markup a renderer would act on.
	stranger.facts.Identity.Serial = hostileSerial
	if _, err := stranger.register(ctx, c); err != nil {
		t.Fatal(err)
	}
	strangerErr := stranger.heartbeatHolding(ctx, c, "invented", 8)
	t.Logf("the stranger's heartbeat: %v", strangerErr)

	// A rejected machine.
	rejected := newTestAgent(33)
	if _, err := rejected.register(ctx, c); err != nil {
		t.Fatal(err)
	}
	in.cli("machines", "reject", rejected.facts.Identity.BootMac, "--reason", "not ours")
	if err := rejected.heartbeatHolding(ctx, c, "rejected-tenant", 8); err == nil {
		t.Error("a rejected machine's heartbeat was answered")
	}

	var rep bootv1.RackReportData
	if err := protojson.Unmarshal([]byte(in.cli("rack", "report", "r1", "--format", "json")), &rep); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tn := range rep.GetTenants() {
		got = append(got, fmt.Sprintf("%s:%d", tn.GetTenant(), tn.GetGpusAllocated()))
	}
	if len(got) != 1 || got[0] != "alpha:1" {
		t.Fatalf("GPUs by tenant = %v, want only alpha:1 (the bound machine's)", got)
	}
	md := in.cli("rack", "report", "r1", "--format", "md")
	for _, bad := range []string{"invented", "rejected-tenant"} {
		if strings.Contains(md, bad) {
			t.Errorf("the markdown report shows %q:\n%s", bad, md)
		}
	}
	// The stranger's serial is in the report as text: rendered as GitHub would, it
	// makes no link, image or HTML (issue 33, 6d).
	cmark := testreq.Tool(t, "cmark-gfm", "apt-get install cmark-gfm (hack/deps.sh installs it)")
	cmd := exec.Command(cmark, "--extension", "table", "--extension", "autolink", "--extension", "tagfilter")
	cmd.Stdin = strings.NewReader(md)
	html, err := cmd.Output()
	if err != nil {
		t.Fatalf("cmark-gfm: %v", err)
	}
	if strings.Contains(string(html), "<a ") || strings.Contains(string(html), "<img") || !strings.Contains(string(html), "[serial](http") {
		t.Errorf("the stranger's serial %q became markup in the rendered report:\n%s", hostileSerial, html)
	}
	// The stranger's machine record holds no allocation either (what a later state
	// change could otherwise bring into the report).
	for _, m := range in.listMachines() {
		if m.GetIdentity().GetBootMac() == stranger.facts.Identity.BootMac && len(m.GetGpuAllocation().GetHolders()) > 0 {
			t.Errorf("the stranger's record keeps its allocation: %v", m.GetGpuAllocation())
		}
	}
}

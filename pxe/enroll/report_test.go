package enroll

import (
	"context"
	"crypto/tls"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// TestReportFromKeyNotCurrentIsRefused: a report signed by a key that is not the
// identity's current one is not stored, and the agent gets an error (it resends),
// not an OK it would take for delivery.
func TestReportFromKeyNotCurrentIsRefused(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:31", "SN31")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve("52:54:00:00:00:31")
	b := a.rebooted()
	if r := b.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING); !strings.Contains(r.Message, "another key") {
		t.Fatalf("second key: %q; want it told another key is bound", r.Message)
	}
	_, err := b.report(b.c, true, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_PASS)
	wantCode(t, err, codes.FailedPrecondition, "report from a key that is not current")
	if !strings.Contains(err.Error(), "not stored") {
		t.Errorf("error %q does not say the report was not stored", err)
	}
	if m := e.machine("52:54:00:00:00:31"); len(m.Checklist) != 0 || m.State != inventory.Approved {
		t.Fatalf("machine %s with %d checklist bytes; want approved with none stored", m.State, len(m.Checklist))
	}
	// The bound key's report is stored.
	if _, err := a.report(a.c, true, machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL, machinev1.CheckStatus_CHECK_STATUS_PASS); err != nil {
		t.Fatal(err)
	}
	if m := e.machine("52:54:00:00:00:31"); len(m.Checklist) == 0 {
		t.Fatal("the bound key's report was not stored")
	}
}

// joined takes a new machine through approval and its bundle, and returns the agent,
// an mTLS client with its certificate and the node name.
func joined(e *env, mac string) (*agent, bootv1.EnrollmentServiceClient, string) {
	e.t.Helper()
	a, cert := bundled(e, mac)
	return a, e.client(tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert}), e.machine(mac).NodeName
}

// TestEarlyReportAppliedWhenNodeRegisters: a commissioning report that arrives while
// the machine is joining is kept and decides ready or quarantined once the Node
// registers; one that cannot be applied is an error and stays stored, never dropped.
func TestEarlyReportAppliedWhenNodeRegisters(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a, mtls, node := joined(e, "52:54:00:00:00:32")
	rr, err := a.report(mtls, false, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_FAIL)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_JOINING || !strings.Contains(rr.Message, "when the Node registers") {
		t.Fatalf("early report: %v, %v", rr, err)
	}
	good := e.machine("52:54:00:00:00:32").CommissioningReport
	if len(good) == 0 {
		t.Fatal("early report not kept")
	}

	// A report that does not decode: NodeRegistered fails, nothing moves, the report stays.
	if _, err := e.store.Update(ctx, e.machine("52:54:00:00:00:32").ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		m.CommissioningReport = []byte{0xff, 0xff}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.NodeRegistered(ctx, node, e.nodeBootID(t, node)); err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("NodeRegistered with an unreadable early report: %v; want an error saying so", err)
	}
	if m := e.machine("52:54:00:00:00:32"); m.State != inventory.Joining || len(m.CommissioningReport) != 2 {
		t.Fatalf("after the failed apply: %s with %d report bytes; want joining with the report kept", m.State, len(m.CommissioningReport))
	}

	// The readable report moves the machine through commissioning to quarantined.
	if _, err := e.store.Update(ctx, e.machine("52:54:00:00:00:32").ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		m.CommissioningReport = good
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	m, err := e.svc.NodeRegistered(ctx, node, e.nodeBootID(t, node))
	if err != nil || m.State != inventory.Quarantined || len(m.CommissioningReport) != 0 {
		t.Fatalf("NodeRegistered: %+v, %v; want quarantined with the report applied", m, err)
	}
	e.checkHistory("52:54:00:00:00:32")
}

// TestOnChangeOnlyForStateOrNodeName: the node controller is told about a machine when
// its state or node name changes, not on every heartbeat (which would make reconcile
// work grow with the square of the machine count).
func TestOnChangeOnlyForStateOrNodeName(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	e := newEnv(t, func(c *Config) {
		c.OnChange = func(m *inventory.Machine) {
			mu.Lock()
			calls = append(calls, string(m.State)+" "+m.NodeName)
			mu.Unlock()
		}
	})
	took := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := calls
		calls = nil
		return out
	}
	a, mtls, node := joined(e, "52:54:00:00:00:33")
	// registered, approved, joining with its node name.
	if got := took(); len(got) != 3 || got[2] != "joining "+node {
		t.Fatalf("OnChange calls through the bundle: %q; want registered, approved, joining %s", got, node)
	}
	for i := 0; i < 3; i++ {
		e.clk.Add(DefaultHeartbeatEvery)
		if _, err := a.heartbeat(mtls, false); err != nil {
			t.Fatal(err)
		}
	}
	if got := took(); len(got) != 0 {
		t.Fatalf("heartbeats that change neither state nor node name called OnChange: %q", got)
	}
	if _, err := e.svc.NodeRegistered(context.Background(), node, e.nodeBootID(t, node)); err != nil {
		t.Fatal(err)
	}
	if got := took(); len(got) != 1 || got[0] != "commissioning "+node {
		t.Fatalf("OnChange after the Node registered: %q; want [commissioning %s]", got, node)
	}
}

// TestCommissioningMove is the decision table for a COMMISSIONING report: a failing
// report quarantines; a passing simulated one quarantines unless simulated machines are
// allowed, and its reason says how to allow them (CONTRACTS §11).
func TestCommissioningMove(t *testing.T) {
	idx := int32(2)
	report := func(st machinev1.CheckStatus, simulated bool) *machinev1.Checklist {
		return &machinev1.Checklist{Phase: machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, Overall: st, Simulated: simulated,
			Results: []*machinev1.CheckResult{{Id: "gpu.ecc.volatile-uncorrected", Status: st, GpuIndex: &idx}}}
	}
	pass, fail := machinev1.CheckStatus_CHECK_STATUS_PASS, machinev1.CheckStatus_CHECK_STATUS_FAIL
	for _, tc := range []struct {
		name           string
		cl             *machinev1.Checklist
		allowSimulated bool
		want           inventory.State
		reason         []string
	}{
		{"real pass", report(pass, false), false, inventory.Ready, []string{"passed"}},
		{"real pass, simulation allowed", report(pass, false), true, inventory.Ready, []string{"passed"}},
		{"real fail", report(fail, false), false, inventory.Quarantined, []string{"failed gpu.ecc.volatile-uncorrected on GPU 2"}},
		{"simulated pass, not allowed", report(pass, true), false, inventory.Quarantined, []string{"simulated", "enrollment.allowSimulated: true"}},
		{"simulated pass, allowed", report(pass, true), true, inventory.Ready, []string{"passed", "simulated"}},
		{"simulated fail, allowed", report(fail, true), true, inventory.Quarantined, []string{"failed gpu.ecc.volatile-uncorrected on GPU 2"}},
		{"simulated fail, not allowed", report(fail, true), false, inventory.Quarantined, []string{"failed"}},
	} {
		to, reason := commissioningMove(tc.cl, tc.allowSimulated)
		if to != tc.want {
			t.Errorf("%s: moves to %s (%q); want %s", tc.name, to, reason, tc.want)
		}
		for _, w := range tc.reason {
			if !strings.Contains(reason, w) {
				t.Errorf("%s: reason %q does not contain %q", tc.name, reason, w)
			}
		}
	}
}

// TestSimulatedMachineReadyOnlyWhenAllowed: through the service and a bbolt inventory,
// a simulated agent's passing commissioning report quarantines the machine with a
// reason naming the setting; with enrollment.allowSimulated on it becomes ready, and
// a report received while joining is held to the same rule.
func TestSimulatedMachineReadyOnlyWhenAllowed(t *testing.T) {
	ctx := context.Background()
	pass := machinev1.CheckStatus_CHECK_STATUS_PASS
	commissioning := machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING
	for _, allow := range []bool{false, true} {
		e := newEnv(t, func(c *Config) { c.AllowSimulated = allow })
		want, wantProto := inventory.Quarantined, bootv1.MachineState_MACHINE_STATE_QUARANTINED
		if allow {
			want, wantProto = inventory.Ready, bootv1.MachineState_MACHINE_STATE_READY
		}

		// Report after the Node registered.
		a, mtls, node := joined(e, "52:54:00:00:00:41")
		a.simulated = true
		if _, err := e.svc.NodeRegistered(ctx, node, e.nodeBootID(t, node)); err != nil {
			t.Fatal(err)
		}
		rr, err := a.report(mtls, false, commissioning, pass)
		if err != nil || rr.MachineState != wantProto {
			t.Fatalf("allowSimulated=%v: simulated report: %v, %v; want %s", allow, rr, err, wantProto)
		}
		if !allow && !strings.Contains(rr.Message, "enrollment.allowSimulated: true") {
			t.Errorf("quarantine message %q does not say how to allow simulated machines", rr.Message)
		}
		m := e.machine("52:54:00:00:00:41")
		h, err := e.store.History(ctx, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if last := h[len(h)-1]; m.State != want || last.To != want || !strings.Contains(last.Reason, "simulated") {
			t.Errorf("allowSimulated=%v: stored %s, last transition %+v; want %s with a reason naming simulation", allow, m.State, last, want)
		}
		// The same machine reporting as real hardware is ready either way.
		a.simulated = false
		if rr, err := a.report(mtls, false, commissioning, pass); err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
			t.Fatalf("allowSimulated=%v: real report: %v, %v; want ready", allow, rr, err)
		}

		// Report received while joining, applied when the Node registers.
		b, bmtls, bnode := joined(e, "52:54:00:00:00:42")
		b.simulated = true
		if _, err := b.report(bmtls, false, commissioning, pass); err != nil {
			t.Fatal(err)
		}
		if m, err := e.svc.NodeRegistered(ctx, bnode, e.nodeBootID(t, bnode)); err != nil || m.State != want {
			t.Fatalf("allowSimulated=%v: early simulated report applied: %+v, %v; want %s", allow, m, err, want)
		}
		e.checkHistory("52:54:00:00:00:41")
		e.checkHistory("52:54:00:00:00:42")
	}
}

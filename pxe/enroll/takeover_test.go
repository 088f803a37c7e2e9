package enroll

import (
	"context"
	"math/big"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// ready takes a new machine to ready: approval, bundle, Node registered and a passing
// commissioning report over mTLS. It returns the agent, its mTLS client and the
// serial (hex) of its agent certificate.
func ready(e *env, mac string) (*agent, bootv1.EnrollmentServiceClient, string) {
	e.t.Helper()
	a, mtls, node := joined(e, mac)
	if _, err := e.svc.NodeRegistered(context.Background(), node, e.nodeBootID(e.t, node)); err != nil {
		e.t.Fatal(err)
	}
	rr, err := a.report(mtls, false, machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, machinev1.CheckStatus_CHECK_STATUS_PASS)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
		e.t.Fatalf("commissioning report: %v, %v", rr, err)
	}
	serials := e.machine(mac).AgentCertSerials
	if len(serials) != 1 {
		e.t.Fatalf("%d agent certificates recorded, want 1", len(serials))
	}
	return a, mtls, serials[0]
}

// TestForgedBootCannotTakeOver (issue 14 item 1): anyone can send /boot.ipxe with a
// machine's MAC, UUID and serial and then Register any key. Against a live, ready
// machine that must not end its agent's key, revoke its certificate, move its state or
// release anything to the stranger, in either re-enrollment mode; the attempt is
// recorded where an operator sees it.
func TestForgedBootCannotTakeOver(t *testing.T) {
	for _, mode := range []Reenroll{ReenrollAuto, ReenrollManual} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Reenroll = mode })
			const mac = "52:54:00:00:00:40"
			a, mtls, serial := ready(e, mac)
			if _, err := a.heartbeat(mtls, false); err != nil {
				t.Fatal(err)
			}
			// The forger: the identity read off the wire, its own key.
			id, _ := identity.New(mac, a.facts.Identity.SmbiosUuid, a.facts.Identity.Serial)
			if _, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("198.51.100.7")); err != nil {
				t.Fatal(err)
			}
			s := a.rebooted()
			for i := 0; i < 3; i++ {
				r, err := s.register()
				if err != nil {
					t.Fatalf("stranger's register %d: %v", i, err)
				}
				if r.Status == bootv1.RegisterStatus_REGISTER_STATUS_APPROVED || r.Token != "" {
					t.Fatalf("stranger's register %d: %s with token %q (%s): it may fetch the machine's JoinBundle", i, r.Status, r.Token, r.Message)
				}
				e.clk.Add(DefaultHeartbeatEvery)
				if hb, err := a.heartbeat(mtls, false); err != nil {
					t.Fatalf("the real agent's heartbeat after the forgery: %v", err)
				} else if hb.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
					t.Fatalf("the real agent's heartbeat: state %s, want ready", hb.MachineState)
				}
			}
			m := e.machine(mac)
			if m.State != inventory.Ready {
				t.Fatalf("state %s after the forgery, want ready", m.State)
			}
			if m.BoundKey != a.fp() {
				t.Fatalf("bound key %s, want the real agent's %s", m.BoundKey, a.fp())
			}
			if i := m.FindKey(a.fp()); i < 0 || !m.Keys[i].Live(e.clk.Now()) {
				t.Fatalf("the real agent's key is not live after the forgery: %+v", m.Keys)
			}
			sn, _ := new(big.Int).SetString(serial, 16)
			if e.svc.Revoked(sn) {
				t.Fatal("the real agent's certificate was revoked by a forged boot request")
			}
			if len(m.AgentCertSerials) != 1 || m.AgentCertSerials[0] != serial {
				t.Fatalf("agent certificates %v, want [%s]", m.AgentCertSerials, serial)
			}
			// Visible for an operator: the stranger's key is recorded beside the bound one.
			if m.FindKey(s.fp()) < 0 {
				t.Fatalf("the stranger's key is not recorded on the machine: keys %+v", m.Keys)
			}
			e.checkHistory(mac)
		})
	}
}

// TestAllowlistRowBindsOneMachine (issue 14 item 2): a listed serial and MAC with a
// made-up UUID is a second identity; the row already approved a machine, so the second
// one is never approved, by a boot request nor by Register.
func TestAllowlistRowBindsOneMachine(t *testing.T) {
	list, err := policy.ParseListBytes("r1.csv", []byte("serial,mac,rack,slot\nSN41,52:54:00:00:00:41,r1,U41\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Policy = policy.Policy{Mode: policy.Allowlist, List: list} })
	const mac = "52:54:00:00:00:41"
	a := e.agent(mac, "SN41")
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if _, err := a.bundle(r.Token, r.Challenge); err != nil {
		t.Fatal(err)
	}
	// A forger with the listed serial and MAC and another UUID, through /boot.ipxe ...
	fake, _ := identity.New(mac, "00000000-1111-2222-3333-444444444444", "SN41")
	if _, err := e.svc.DecideBoot(context.Background(), fake, netip.MustParseAddr("198.51.100.8")); err != nil {
		t.Fatal(err)
	}
	if m, err := e.store.Lookup(context.Background(), fake.Key()); err != nil {
		t.Fatal(err)
	} else if m.State.Bound() {
		t.Fatalf("a boot request with a made-up UUID became a %s machine", m.State)
	}
	// ... and through Register.
	f := e.agent(mac, "SN41")
	f.facts.Identity.SmbiosUuid = fake.UUID
	for i := 0; i < 2; i++ {
		r, err := f.register()
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == bootv1.RegisterStatus_REGISTER_STATUS_APPROVED || r.Token != "" {
			t.Fatalf("a made-up UUID on a listed row was approved: %s (%s)", r.Status, r.Message)
		}
	}
	m, err := e.store.Lookup(context.Background(), fake.Key())
	if err != nil {
		t.Fatal(err)
	}
	if m.State.Bound() || m.BoundKey != "" {
		t.Fatalf("second identity on the row: state %s, bound key %q", m.State, m.BoundKey)
	}
	// The real machine is untouched.
	real, err := e.store.Lookup(context.Background(), identity.Identity{MAC: mac, UUID: a.facts.Identity.SmbiosUuid, Serial: "SN41"}.Key())
	if err != nil || real.State != inventory.Joining || real.BoundKey != a.fp() {
		t.Fatalf("the real machine after the forgery: %+v, %v", real, err)
	}
}

// TestUnchangedRegisterDoesNotWrite (issue 14 item 4): a Register that changes nothing
// (same key, same facts, same state) commits no transaction to the inventory file.
func TestUnchangedRegisterDoesNotWrite(t *testing.T) {
	e := newEnv(t, nil)
	a := e.agent("52:54:00:00:00:42", "SN42")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.clk.Add(time.Second)
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	before := e.store.Writes()
	for i := 0; i < 5; i++ {
		e.clk.Add(time.Second)
		a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	}
	if n := e.store.Writes() - before; n != 0 {
		t.Fatalf("5 unchanged Registers committed %d write transactions, want 0", n)
	}
	// New facts are written.
	a.facts.Ips = []string{"192.0.2.99"}
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if n := e.store.Writes() - before; n != 1 {
		t.Fatalf("a Register with new facts committed %d write transactions, want 1", n)
	}
	// The key stays live while it keeps polling, although not every poll is written.
	for i := 0; i < 30; i++ {
		e.clk.Add(DefaultPollEvery)
		a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	}
	m := e.machine("52:54:00:00:00:42")
	if i := m.FindKey(a.fp()); i < 0 || !m.Keys[i].Live(e.clk.Now()) {
		t.Fatalf("a polling key is not live: %+v", m.Keys)
	}
}

// TestRejectedMachineCannotHeartbeatOrReport (issue 14 item 6): once an operator
// rejected a machine, its key's Heartbeat and ReportCommissioning are refused.
func TestRejectedMachineCannotHeartbeatOrReport(t *testing.T) {
	e := newEnv(t, nil)
	const mac = "52:54:00:00:00:43"
	a := e.agent(mac, "SN43")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if _, err := a.heartbeat(a.c, true); err != nil {
		t.Fatalf("heartbeat before the rejection: %v", err)
	}
	if _, err := e.svc.Reject(context.Background(), mac, "operator:test", "not ours"); err != nil {
		t.Fatal(err)
	}
	before := e.machine(mac)
	_, err := a.heartbeat(a.c, true)
	wantCode(t, err, codes.PermissionDenied, "heartbeat of a rejected machine")
	_, err = a.report(a.c, true, machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL, machinev1.CheckStatus_CHECK_STATUS_PASS)
	wantCode(t, err, codes.PermissionDenied, "report of a rejected machine")
	after := e.machine(mac)
	if !after.LastHeartbeat.Equal(before.LastHeartbeat) || string(after.Health) != string(before.Health) || string(after.Checklist) != string(before.Checklist) {
		t.Fatal("a rejected machine's heartbeat or report was stored")
	}
}

package admin

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// powerRig is the operator surface over the real enrollment service, a bbolt
// inventory, a rack manifest with a bmc column, and test BMCs.
type powerRig struct {
	srv      *Server
	operator context.Context
	viewer   context.Context
	// BMCs by name: "ok", "stuck" (power never changes), "refuses" (another password).
	bmcs map[string]*redfishtest.Server
}

// newPowerRig discovers five machines: SN1 on BMC ok, SN2 on stuck, SN3 on refuses,
// SN4 in a row without a bmc, SN5 on BMC ok in rack r2, which has no BMC account.
func newPowerRig(t *testing.T, block chan struct{}) *powerRig {
	t.Helper()
	ctx := context.Background()
	r := &powerRig{bmcs: map[string]*redfishtest.Server{
		"ok": redfishtest.New(t, redfishtest.Config{PowerDelay: 20 * time.Millisecond, OnReset: func(string) {
			if block != nil {
				<-block
			}
		}}),
		"stuck":   redfishtest.New(t, redfishtest.Config{PowerStuck: true}),
		"refuses": redfishtest.New(t, redfishtest.Config{Password: "another"}),
	}}
	manifest := fmt.Sprintf("serial,mac,rack,slot,bmc\nSN1,52:54:00:00:00:61,r1,U01,%s\nSN2,52:54:00:00:00:62,r1,U02,%s\nSN3,52:54:00:00:00:63,r1,U03,%s\nSN4,52:54:00:00:00:64,r1,U04,\nSN5,52:54:00:00:00:65,r2,U01,%s\n",
		r.bmcs["ok"].URL, r.bmcs["stuck"].URL, r.bmcs["refuses"].URL, r.bmcs["ok"].URL)
	list, err := policy.ParseListBytes("r1.csv", []byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := bmc.ParseCredentials(bmc.CredentialsFile, []byte("racks:\n  r1:\n    username: admin\n    password: redfishtest\n    ca: |\n"+indented(string(r.bmcs["ok"].CAPEM()))))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	svc, err := enroll.New(ctx, enroll.Config{Store: store, CA: ca, Revocations: pki.NewRevocationList(), Policy: policy.Policy{Mode: policy.Manual, List: list},
		Racks:       map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: strings.Repeat("a", 40)}, "r2": {Name: "r2", DefaultImage: strings.Repeat("a", 40)}},
		DefaultRack: "r1",
		BMC:         enroll.BMCAccess{Credentials: creds, Options: bmc.Options{Timeout: 300 * time.Millisecond, PollInterval: 10 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		id, _ := identity.New(fmt.Sprintf("52:54:00:00:00:6%d", i), "", fmt.Sprintf("SN%d", i))
		if _, err := svc.DecideBoot(ctx, id, netip.MustParseAddr("192.0.2.61")); err != nil {
			t.Fatal(err)
		}
	}
	r.srv, err = New(Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1", "r2"}})
	if err != nil {
		t.Fatal(err)
	}
	viewer, _ := pki.IssueOperatorLevel(ca, "vera", pki.LevelViewer)
	operator, _ := pki.IssueOperatorLevel(ca, "olga", pki.LevelOperator)
	r.viewer, r.operator = asPeer(ctx, viewer.Cert), asPeer(ctx, operator.Cert)
	return r
}

func indented(s string) string {
	return "      " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n      ") + "\n"
}

func (r *powerRig) power(machine string, a bootv1.PowerAction) (*bootv1.PowerMachineResponse, error) {
	return r.srv.PowerMachine(r.operator, &bootv1.PowerMachineRequest{Machine: machine, Action: a, Reason: "test"})
}

// lastTransition is the machine's latest history entry.
func (r *powerRig) lastTransition(t *testing.T, machine string) *bootv1.Transition {
	t.Helper()
	h, err := r.srv.History(r.operator, &bootv1.HistoryRequest{Machine: machine})
	if err != nil {
		t.Fatal(err)
	}
	return h.Transitions[len(h.Transitions)-1]
}

// TestPowerMachineOverEnrollment runs PowerMachine through the operator surface, the
// enrollment service and pxe/bmc against test BMCs: the levels, the response, the
// history, and each refusal with its code.
func TestPowerMachineOverEnrollment(t *testing.T) {
	r := newPowerRig(t, nil)
	const m1 = "52:54:00:00:00:61"
	// Discovery carried the manifest's address into the record.
	if m, err := r.srv.GetMachine(r.viewer, &bootv1.GetMachineRequest{Machine: "52:54:00:00:00:65"}); err != nil || m.Bmc != r.bmcs["ok"].URL {
		t.Fatalf("GetMachine before any power action: bmc %q, %v; want the manifest's address", m.GetBmc(), err)
	}
	if _, err := r.srv.PowerMachine(r.viewer, &bootv1.PowerMachineRequest{Machine: m1, Action: bootv1.PowerAction_POWER_ACTION_STATUS}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a viewer's power status: %v; want PermissionDenied", err)
	}
	if _, err := r.power(m1, bootv1.PowerAction_POWER_ACTION_UNSPECIFIED); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no action: %v; want InvalidArgument", err)
	}
	got, err := r.power(m1, bootv1.PowerAction_POWER_ACTION_OFF)
	if err != nil {
		t.Fatalf("power off: %v", err)
	}
	if got.PowerState != "Off" || got.PowerStateBefore != "On" || got.Bmc != r.bmcs["ok"].URL || got.System != "1" || len(got.Resets) != 1 ||
		got.Resets[0].ResetType != "ForceOff" || got.Resets[0].HttpStatus != 204 || !got.Resets[0].Reached || got.Elapsed.AsDuration() <= 0 {
		t.Fatalf("power off answered %v", got)
	}
	last := r.lastTransition(t, m1)
	if last.Action != "power off" || last.Actor != "operator:olga" || last.From != last.To ||
		!strings.Contains(last.Reason, "ForceOff (HTTP 204): On → Off in ") || !strings.HasSuffix(last.Reason, ": test") {
		t.Fatalf("history ends with %v", last)
	}
	st, err := r.power(m1, bootv1.PowerAction_POWER_ACTION_STATUS)
	if err != nil || st.PowerState != "Off" || len(st.Resets) != 0 {
		t.Fatalf("status: %v, %v", st, err)
	}
	if again := r.lastTransition(t, m1); again.Action != "power off" {
		t.Fatalf("status was recorded in the history: %v", again)
	}
	m, err := r.srv.GetMachine(r.viewer, &bootv1.GetMachineRequest{Machine: m1})
	if err != nil || m.Bmc != r.bmcs["ok"].URL {
		t.Fatalf("GetMachine: bmc %q, %v; want the manifest's address", m.GetBmc(), err)
	}

	for _, tc := range []struct {
		name, machine string
		code          codes.Code
		want          string
	}{
		{"power never changes", "52:54:00:00:00:62", codes.DeadlineExceeded, "PowerState is still On after 300ms waiting for Off"},
		{"wrong password", "52:54:00:00:00:63", codes.FailedPrecondition, "refused the credentials (401): check the BMC user and password in gpuboot's state (bmc-credentials.yaml, rack r1)"},
		{"no bmc column", "52:54:00:00:00:64", codes.FailedPrecondition, "has no BMC address: add a bmc column (https://host[:port]) to its row in the rack manifest r1.csv"},
		{"no account for the rack", "52:54:00:00:00:65", codes.FailedPrecondition, `no BMC credentials for rack "r2" in bmc-credentials.yaml, and no default account`},
		{"unknown machine", "52:54:00:00:00:69", codes.NotFound, "not found"},
	} {
		_, err := r.power(tc.machine, bootv1.PowerAction_POWER_ACTION_OFF)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %s with %q", tc.name, err, tc.code, tc.want)
		}
	}
	if last := r.lastTransition(t, "52:54:00:00:00:62"); last.Action != "power off failed" || !strings.Contains(last.Reason, "still On") {
		t.Errorf("the stuck machine's history ends with %v; want the failure recorded", last)
	}
	if n := r.bmcs["refuses"].Refusals(); n != 1 {
		t.Errorf("the BMC that refuses saw %d refused logins; want 1 (no retries)", n)
	}
	for name, b := range r.bmcs {
		if n := b.LiveSessions(); n != 0 {
			t.Errorf("BMC %s: %d sessions left open", name, n)
		}
	}
}

// TestPowerMachineOneAtATime: a second power action on a machine while one is under
// way is refused, not queued behind it.
func TestPowerMachineOneAtATime(t *testing.T) {
	block := make(chan struct{})
	r := newPowerRig(t, block)
	const m1 = "52:54:00:00:00:61"
	done := make(chan error, 1)
	go func() {
		_, err := r.power(m1, bootv1.PowerAction_POWER_ACTION_CYCLE)
		done <- err
	}()
	// Wait until the first action's Reset reached the BMC (it blocks there).
	deadline := time.Now().Add(10 * time.Second)
	for len(r.bmcs["ok"].Requests()) == 0 || !strings.Contains(strings.Join(r.bmcs["ok"].Requests(), " "), "ComputerSystem.Reset") {
		if time.Now().After(deadline) {
			t.Fatal("the first power action never reached the BMC")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err := r.power(m1, bootv1.PowerAction_POWER_ACTION_OFF)
	close(block)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is under way") {
		t.Errorf("a second action meanwhile: %v; want FailedPrecondition", err)
	}
	if err := <-done; err != nil {
		t.Errorf("the first action: %v", err)
	}
	if last := r.lastTransition(t, m1); last.Action != "power cycle" {
		t.Errorf("history ends with %v; want the cycle", last)
	}
}

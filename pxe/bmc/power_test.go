package bmc_test

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
)

// fast are Options for a test BMC that answers in milliseconds.
var fast = bmc.Options{Timeout: 3 * time.Second, TaskTimeout: 3 * time.Second, PollInterval: 10 * time.Millisecond, RequestTimeout: 5 * time.Second}

func endpoint(srv *redfishtest.Server) bmc.Endpoint {
	return bmc.Endpoint{Address: srv.URL, Username: srv.Username(), Password: srv.Password(), CAPEM: srv.CAPEM()}
}

// checkLoggedOut fails t unless every session the calls opened was deleted.
func checkLoggedOut(t *testing.T, srv *redfishtest.Server) {
	t.Helper()
	if n := srv.LiveSessions(); n != 0 {
		t.Errorf("%d Redfish sessions left open on the BMC, want 0 (each call logs out)", n)
	}
}

func TestPowerOnOffCycleStatus(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{PowerState: "Off", PowerDelay: 50 * time.Millisecond})
	ep, ctx := endpoint(srv), context.Background()

	steps := []struct {
		action     bmc.Action
		want       bmc.PowerState
		wantResets []string
	}{
		{bmc.ActionOn, bmc.PowerOn, []string{"On"}},
		{bmc.ActionOn, bmc.PowerOn, []string{"On"}}, // already on: nothing sent
		{bmc.ActionOff, bmc.PowerOff, []string{"On", "ForceOff"}},
		{bmc.ActionOff, bmc.PowerOff, []string{"On", "ForceOff"}},
		{bmc.ActionCycle, bmc.PowerOn, []string{"On", "ForceOff", "On"}}, // off: cycle powers on
		{bmc.ActionCycle, bmc.PowerOn, []string{"On", "ForceOff", "On", "PowerCycle"}},
		{bmc.ActionStatus, bmc.PowerOn, []string{"On", "ForceOff", "On", "PowerCycle"}},
	}
	for i, st := range steps {
		res, err := bmc.Power(ctx, ep, "", st.action, fast)
		if err != nil {
			t.Fatalf("step %d: power %s: %v", i, st.action, err)
		}
		if res.PowerState != st.want || res.System != "1" || res.Address != srv.URL {
			t.Errorf("step %d: power %s = %+v, want PowerState %s on system 1 of %s", i, st.action, res, st.want, srv.URL)
		}
		if got := srv.Resets(); !slices.Equal(got, st.wantResets) {
			t.Errorf("step %d: BMC got Resets %q, want %q", i, got, st.wantResets)
		}
		for _, r := range res.Resets {
			if r.HTTPStatus != 204 || !r.Reached || r.Expect == "" {
				t.Errorf("step %d: reset %+v, want 204 and the state reached", i, r)
			}
		}
		if res.LogoutError != "" {
			t.Errorf("step %d: logout: %s", i, res.LogoutError)
		}
	}
	state, err := bmc.Status(ctx, ep, "1", fast)
	if err != nil || state != bmc.PowerOn {
		t.Errorf("Status = %q, %v; want On", state, err)
	}
	checkLoggedOut(t, srv)
}

func TestPowerFollowsTask(t *testing.T) {
	for _, monitor := range []bool{false, true} {
		name := map[bool]string{false: "Location is the Task", true: "Location is a task monitor"}[monitor]
		t.Run(name, func(t *testing.T) {
			srv := redfishtest.New(t, redfishtest.Config{AsyncTask: true, TaskDelay: 100 * time.Millisecond, TaskMonitorLocation: monitor, PowerDelay: 150 * time.Millisecond})
			res, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionOff, fast)
			if err != nil {
				t.Fatalf("power off: %v", err)
			}
			if len(res.Resets) != 1 {
				t.Fatalf("resets %+v, want one", res.Resets)
			}
			r := res.Resets[0]
			if r.HTTPStatus != 202 || r.Task == "" || r.Elapsed <= 0 || (r.TaskState != "Completed" && r.TaskState != "done") || !r.Reached || res.PowerState != bmc.PowerOff {
				t.Errorf("result %+v, reset %+v: want 202, the task followed to its end and PowerState Off", res, r)
			}
			checkLoggedOut(t, srv)
		})
	}
}

func TestPowerTaskException(t *testing.T) {
	for _, monitor := range []bool{false, true} {
		srv := redfishtest.New(t, redfishtest.Config{AsyncTask: true, TaskDelay: 30 * time.Millisecond, TaskFails: true, TaskMonitorLocation: monitor, PowerStuck: true})
		res, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionOff, fast)
		if bmc.KindOf(err) != bmc.KindFailed || !strings.Contains(err.Error(), "host did not respond") || !strings.Contains(err.Error(), srv.URL) {
			t.Errorf("monitor %v: err = %v, want a KindFailed error naming the BMC with the task's message", monitor, err)
		}
		if len(res.Resets) != 1 || res.Resets[0].HTTPStatus != 202 {
			t.Errorf("monitor %v: resets %+v, want the one 202", monitor, res.Resets)
		}
		checkLoggedOut(t, srv)
	}
}

func TestActionSpelling(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{})
	res, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.Action("OFF"), fast)
	if err != nil || res.Action != bmc.ActionOff || res.PowerState != bmc.PowerOff {
		t.Errorf("power OFF = %+v, %v; want off", res, err)
	}
	before := len(srv.Requests())
	if _, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.Action("reboot"), fast); bmc.KindOf(err) != bmc.KindInvalid {
		t.Errorf("power reboot: %v, want KindInvalid", err)
	}
	if n := len(srv.Requests()); n != before {
		t.Errorf("an invalid action reached the BMC: %q", srv.Requests()[before:])
	}
}

func TestCycleWithoutPowerCycle(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{AllowedResetTypes: []string{"On", "ForceOff"}, PowerDelay: 30 * time.Millisecond})
	res, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionCycle, fast)
	if err != nil {
		t.Fatalf("cycle: %v", err)
	}
	if got := srv.Resets(); !slices.Equal(got, []string{"ForceOff", "On"}) {
		t.Errorf("BMC got Resets %q, want ForceOff then On", got)
	}
	if len(res.Resets) != 2 || res.Resets[0].Expect != bmc.PowerOff || res.PowerState != bmc.PowerOn {
		t.Errorf("result %+v: want ForceOff waited to Off, then On", res)
	}
	checkLoggedOut(t, srv)
}

func TestWrongPassword(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{})
	ep := endpoint(srv)
	ep.Password = "wrong"
	ep.CredentialsSource = "bmc-credentials.yaml, rack r1"
	_, err := bmc.Power(context.Background(), ep, "", bmc.ActionOff, fast)
	want := "BMC " + srv.URL + " refused the credentials (401): check the BMC user and password in gpuboot's state (bmc-credentials.yaml, rack r1)"
	if err == nil || err.Error() != want || bmc.KindOf(err) != bmc.KindCredentials {
		t.Errorf("err = %v, want %q", err, want)
	}
	logins := 0
	for _, r := range srv.Requests() {
		if r == "POST /redfish/v1/SessionService/Sessions" {
			logins++
		}
	}
	if logins != 1 || srv.Refusals() != 1 || len(srv.Resets()) != 0 {
		t.Errorf("BMC saw %d logins, %d refusals, resets %q: want one attempt and no Reset (no retries)", logins, srv.Refusals(), srv.Resets())
	}
	checkLoggedOut(t, srv)
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := "https://" + l.Addr().String()
	l.Close() // a closed port: connection refused
	start := time.Now()
	_, err = bmc.Power(context.Background(), bmc.Endpoint{Address: address, Username: "admin", Password: "x"}, "", bmc.ActionStatus, fast)
	if bmc.KindOf(err) != bmc.KindUnreachable || !strings.Contains(err.Error(), "BMC "+address+" is unreachable") {
		t.Errorf("err = %v, want a KindUnreachable error naming %s", err, address)
	}
	if d := time.Since(start); d > fast.RequestTimeout {
		t.Errorf("took %s to fail, want under the request timeout %s", d, fast.RequestTimeout)
	}
}

func TestPowerNeverChanges(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{PowerStuck: true})
	opts := fast
	opts.Timeout = 200 * time.Millisecond
	res, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionOff, opts)
	if bmc.KindOf(err) != bmc.KindTimeout || !strings.Contains(err.Error(), "PowerState is still On after 200ms waiting for Off") || !strings.Contains(err.Error(), "system 1") {
		t.Errorf("err = %v, want a timeout naming the state it was stuck in", err)
	}
	if len(res.Resets) != 1 || res.Resets[0].Reached || res.PowerState != bmc.PowerOn {
		t.Errorf("result %+v: want one Reset, not reached, PowerState On", res)
	}
	if got := srv.Resets(); len(got) != 1 {
		t.Errorf("BMC got Resets %q, want exactly one (no retries)", got)
	}
	checkLoggedOut(t, srv)
}

func TestResetTypeNotAllowed(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{AllowedResetTypes: []string{"On", "GracefulShutdown"}})
	_, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionOff, fast)
	if bmc.KindOf(err) != bmc.KindUnsupported || !strings.Contains(err.Error(), "allows only On, GracefulShutdown") {
		t.Errorf("err = %v, want the allowed ResetTypes listed", err)
	}
	if len(srv.Resets()) != 0 {
		t.Errorf("BMC got Resets %q, want none", srv.Resets())
	}
	checkLoggedOut(t, srv)
}

func TestNoResetAction(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{NoResetAction: true})
	_, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionOff, fast)
	if bmc.KindOf(err) != bmc.KindUnsupported || !strings.Contains(err.Error(), "no #ComputerSystem.Reset action") {
		t.Errorf("err = %v, want the missing Reset action named", err)
	}
	checkLoggedOut(t, srv)
}

func TestSystemChoice(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{SystemIDs: []string{"node-b", "node-a"}})
	ep, ctx := endpoint(srv), context.Background()
	if _, err := bmc.Status(ctx, ep, "", fast); bmc.KindOf(err) != bmc.KindNotFound || !strings.Contains(err.Error(), "has 2 systems (node-a, node-b)") {
		t.Errorf("no system named: err = %v, want both named", err)
	}
	if _, err := bmc.Status(ctx, ep, "node-c", fast); bmc.KindOf(err) != bmc.KindNotFound || !strings.Contains(err.Error(), `no system "node-c"; it has node-a, node-b`) {
		t.Errorf("unknown system: err = %v", err)
	}
	res, err := bmc.Power(ctx, ep, "node-b", bmc.ActionOff, fast)
	if err != nil || res.System != "node-b" || srv.PowerState("node-b") != "Off" || srv.PowerState("node-a") != "On" {
		t.Errorf("power off node-b = %+v, %v; node-b %s, node-a %s", res, err, srv.PowerState("node-b"), srv.PowerState("node-a"))
	}
	checkLoggedOut(t, srv)
}

func TestTLSTrust(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{})
	ep := endpoint(srv)
	ep.CAPEM = nil
	if _, err := bmc.Status(context.Background(), ep, "", fast); bmc.KindOf(err) != bmc.KindUnreachable || !strings.Contains(err.Error(), "TLS certificate is not trusted") {
		t.Errorf("untrusted certificate: err = %v", err)
	}
	ep.Insecure = true
	if state, err := bmc.Status(context.Background(), ep, "", fast); err != nil || state != bmc.PowerOn {
		t.Errorf("insecure: Status = %q, %v", state, err)
	}
	ep.CAPEM = []byte("not a certificate")
	if _, err := bmc.Status(context.Background(), ep, "", fast); bmc.KindOf(err) != bmc.KindInvalid {
		t.Errorf("bad CA: err = %v, want KindInvalid", err)
	}
	checkLoggedOut(t, srv)
}

func TestOnResetHook(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := redfishtest.New(t, redfishtest.Config{OnReset: func(resetType string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, resetType)
	}})
	if _, err := bmc.Power(context.Background(), endpoint(srv), "", bmc.ActionCycle, fast); err != nil {
		t.Fatalf("cycle: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"PowerCycle"}) {
		t.Errorf("OnReset saw %q, want PowerCycle", got)
	}
}

func TestBasicAuthAccepted(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{})
	// A client that never logs in, as some tools do: basic auth on each request.
	// The BMC must admit it, and refuse a request with neither token nor credentials.
	ep := endpoint(srv)
	client := srv.Client()
	resp, err := client.Get(ep.Address + "/redfish/v1/Systems/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("GET without credentials: %d, want 401", resp.StatusCode)
	}
	req, err := http.NewRequest(http.MethodGet, ep.Address+"/redfish/v1/Systems/1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(ep.Username, ep.Password)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET with basic auth: %d, want 200", resp.StatusCode)
	}
}

func TestCancelled(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{PowerStuck: true})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := bmc.Power(ctx, endpoint(srv), "", bmc.ActionOff, fast)
	if bmc.KindOf(err) != bmc.KindTimeout {
		t.Errorf("err = %v, want KindTimeout when the caller gives up", err)
	}
	checkLoggedOut(t, srv)
}

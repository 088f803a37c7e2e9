package bmc

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	all := []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"}
	onOff := []string{"On", "ForceOff"}
	tests := []struct {
		name    string
		action  Action
		now     PowerState
		allowed []string
		want    []step
		wantErr string
	}{
		{"status", ActionStatus, PowerOn, all, nil, ""},
		{"on from off", ActionOn, PowerOff, all, []step{{"On", PowerOn}}, ""},
		{"on when on", ActionOn, PowerOn, all, nil, ""},
		{"on while powering on waits", ActionOn, "PoweringOn", all, []step{{"", PowerOn}}, ""},
		{"on with only ForceOn", ActionOn, PowerOff, []string{"ForceOn", "ForceOff"}, []step{{"ForceOn", PowerOn}}, ""},
		{"on not allowed", ActionOn, PowerOff, []string{"ForceOff"}, nil, "needs ResetType On or ForceOn, and this system allows only ForceOff"},
		{"off from on", ActionOff, PowerOn, all, []step{{"ForceOff", PowerOff}}, ""},
		{"off when off", ActionOff, PowerOff, all, nil, ""},
		{"off while powering off waits", ActionOff, "PoweringOff", all, []step{{"", PowerOff}}, ""},
		{"off not allowed", ActionOff, PowerOn, []string{"On", "GracefulShutdown"}, nil, "needs ResetType ForceOff, and this system allows only On, GracefulShutdown"},
		{"cycle with PowerCycle", ActionCycle, PowerOn, all, []step{{"PowerCycle", PowerOn}}, ""},
		{"cycle without PowerCycle", ActionCycle, PowerOn, onOff, []step{{"ForceOff", PowerOff}, {"On", PowerOn}}, ""},
		{"cycle of a machine that is off", ActionCycle, PowerOff, all, []step{{"On", PowerOn}}, ""},
		{"cycle with nothing advertised", ActionCycle, PowerOn, nil, []step{{"ForceOff", PowerOff}, {"On", PowerOn}}, ""},
		{"cycle impossible", ActionCycle, PowerOn, []string{"On", "Nmi"}, nil, "needs ResetType PowerCycle or ForceOff, and this system allows only On, Nmi"},
		{"cycle without on", ActionCycle, PowerOn, []string{"ForceOff"}, nil, "allows only ForceOff"},
		{"unknown action", Action("reboot"), PowerOn, all, nil, `unknown power action "reboot"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := plan(tt.action, tt.now, tt.allowed)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("plan: err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("plan = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseAction(t *testing.T) {
	for _, s := range []string{"on", "OFF", " cycle ", "status"} {
		if _, err := ParseAction(s); err != nil {
			t.Errorf("ParseAction(%q): %v", s, err)
		}
	}
	if _, err := ParseAction("reboot"); err == nil || !strings.Contains(err.Error(), "on, off, cycle, status") {
		t.Errorf("ParseAction(reboot) = %v, want the list of actions", err)
	}
}

func TestNormalizeAddress(t *testing.T) {
	for in, want := range map[string]string{
		"https://10.0.0.5":        "https://10.0.0.5",
		"https://bmc-r1-07:8443/": "https://bmc-r1-07:8443",
		" http://[fd00::5]:8000 ": "http://[fd00::5]:8000",
	} {
		if got, err := NormalizeAddress(in); err != nil || got != want {
			t.Errorf("NormalizeAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "10.0.0.5", "ftp://bmc", "https://bmc/redfish/v1", "https://u:p@bmc", "https://bmc?x=1"} {
		if _, err := NormalizeAddress(in); KindOf(err) != KindInvalid {
			t.Errorf("NormalizeAddress(%q) = %v, want a KindInvalid error", in, err)
		}
	}
}

func TestParseTask(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		done      bool
		state     string
		failed    bool
		wantInMsg string
	}{
		{"monitor running, no body", http.StatusAccepted, "", false, "Running", false, ""},
		{"monitor running with task", http.StatusAccepted, `{"TaskState":"Running"}`, false, "Running", false, ""},
		{"monitor done, no content", http.StatusNoContent, "", true, "done", false, ""},
		{"monitor done, action response", http.StatusOK, `{"@Message.ExtendedInfo":[]}`, true, "done", false, ""},
		{"task running", http.StatusOK, `{"TaskState":"Running"}`, false, "Running", false, ""},
		{"task completed", http.StatusOK, `{"TaskState":"Completed","Messages":[{"Message":"ok","MessageId":"TaskEvent.1.0.TaskCompletedOK"}]}`, true, "Completed", false, "ok (TaskEvent.1.0.TaskCompletedOK)"},
		{"task exception", http.StatusOK, `{"TaskState":"Exception","Messages":[{"Message":"host did not answer"}]}`, true, "Exception", true, "host did not answer"},
		{"202 with a final state", http.StatusAccepted, `{"TaskState":"Killed","Messages":[{"MessageId":"X.1"}]}`, true, "Killed", true, "X.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := parseTask(tt.status, []byte(tt.body))
			if p.done != tt.done || p.state != tt.state || p.failed() != tt.failed {
				t.Errorf("parseTask = %+v (failed %v), want done %v state %q failed %v", p, p.failed(), tt.done, tt.state, tt.failed)
			}
			if tt.wantInMsg != "" && !strings.Contains(strings.Join(p.messages, "|"), tt.wantInMsg) {
				t.Errorf("messages %q, want %q among them", p.messages, tt.wantInMsg)
			}
		})
	}
}

func TestParseResetTarget(t *testing.T) {
	got, err := parseResetTarget([]byte(`{"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset","ResetType@Redfish.AllowableValues":["On"]}}}`))
	if err != nil || got != "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset" {
		t.Errorf("parseResetTarget = %q, %v", got, err)
	}
	if got, err := parseResetTarget([]byte(`{"Actions":{}}`)); err != nil || got != "" {
		t.Errorf("parseResetTarget without Reset = %q, %v; want empty", got, err)
	}
	if _, err := parseResetTarget([]byte(`{"Actions":`)); err == nil {
		t.Error("parseResetTarget of truncated JSON: no error")
	}
}

// FuzzParseResetTarget feeds the ComputerSystem parser untrusted bytes: it must not
// panic, and a target it returns came from the input.
func FuzzParseResetTarget(f *testing.F) {
	f.Add([]byte(`{"Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"}}}`))
	f.Add([]byte(`{"Actions":{"#ComputerSystem.Reset":{"target":7}}}`))
	f.Add([]byte(`{"Actions":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		target, err := parseResetTarget(raw)
		if err != nil && target != "" {
			t.Errorf("error %v with target %q", err, target)
		}
	})
}

// FuzzParseTask feeds the task monitor parser untrusted answers: it must not panic,
// a 202 that names no final TaskState is never done, and a failed task is done.
func FuzzParseTask(f *testing.F) {
	f.Add(202, []byte(`{"TaskState":"Running","Messages":[{"Message":"m","MessageId":"i"}]}`))
	f.Add(200, []byte(`{"TaskState":"Exception"}`))
	f.Add(204, []byte(``))
	f.Add(200, []byte(`{"Messages":[null,{"Message":1}]}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		p := parseTask(status, body)
		if status == http.StatusAccepted && p.done && !taskEnded[p.state] {
			t.Errorf("202 with state %q parsed as done", p.state)
		}
		if p.failed() && !p.done {
			t.Errorf("failed but not done: %+v", p)
		}
		if p.state == "" && !p.done {
			t.Errorf("running task without a state: %+v", p)
		}
	})
}

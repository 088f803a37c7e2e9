package testreq

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a test would have ended. Skipf and Fatalf
// panic with stop, as the real ones end the goroutine, and outcome recovers it.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

type stop struct{}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	panic(stop{})
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	panic(stop{})
}

// outcome runs f against a recorder and returns it.
func outcome(f func(testing.TB)) (r *recorder) {
	r = &recorder{}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stop); !ok {
				panic(v)
			}
		}
	}()
	f(r)
	return r
}

// clearRequired unsets the variables these tests set, for the length of t.
func clearRequired(t *testing.T) {
	for _, env := range []string{RequiredEnv, "GPURACK_K8S_REQUIRED", "GPURACK_TESTREQ_OPTIN"} {
		t.Setenv(env, "")
	}
}

func TestMissingSkipsOrFails(t *testing.T) {
	emptyPath := t.TempDir()
	absent := filepath.Join(t.TempDir(), "absent")
	present := filepath.Join(t.TempDir(), "present")
	if err := os.WriteFile(present, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func(testing.TB)
		want string // in the message; "" means t is not stopped
	}{
		{"missing", func(t testing.TB) { Missing(t, "the widget is gone", "apt-get install widget") }, "the widget is gone; apt-get install widget"},
		{"tool absent", func(t testing.TB) { Tool(t, "gpurack-no-such-tool", "apt-get install gpurack-tools") }, "gpurack-no-such-tool is not in PATH; apt-get install gpurack-tools"},
		{"file absent", func(t testing.TB) { File(t, absent, "run make k8s-bins") }, absent + " is missing"},
		{"file present", func(t testing.TB) { File(t, present, "run make k8s-bins") }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clearRequired(t)
			t.Setenv("PATH", emptyPath)
			r := outcome(c.call)
			if c.want == "" {
				if r.skipped || r.failed {
					t.Fatalf("stopped (skipped %v, failed %v): %s", r.skipped, r.failed, r.msg)
				}
				return
			}
			if !r.skipped || r.failed || !strings.Contains(r.msg, c.want) || !strings.Contains(r.msg, "skipping") {
				t.Errorf("without %s: skipped %v failed %v %q; want a skip naming %q", RequiredEnv, r.skipped, r.failed, r.msg, c.want)
			}
			t.Setenv(RequiredEnv, "1")
			r = outcome(c.call)
			if !r.failed || r.skipped || !strings.Contains(r.msg, c.want) || !strings.Contains(r.msg, RequiredEnv+"=1") {
				t.Errorf("with %s=1: skipped %v failed %v %q; want a failure naming %q", RequiredEnv, r.skipped, r.failed, r.msg, c.want)
			}
		})
	}
}

func TestToolFindsPATH(t *testing.T) {
	clearRequired(t)
	dir := t.TempDir()
	tool := filepath.Join(dir, "gpurack-fake-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	var got string
	r := outcome(func(t testing.TB) { got = Tool(t, "gpurack-fake-tool", "nothing to install") })
	if r.skipped || r.failed || got != tool {
		t.Errorf("Tool = %q (skipped %v, failed %v: %s), want %s", got, r.skipped, r.failed, r.msg, tool)
	}
}

func TestAlsoRequiredBy(t *testing.T) {
	clearRequired(t)
	t.Setenv("GPURACK_K8S_REQUIRED", "1")
	if r := outcome(func(t testing.TB) { Missing(t, "kube-apiserver", "make k8s-bins") }); !r.skipped {
		t.Errorf("GPURACK_K8S_REQUIRED alone made a plain Missing fail: %q", r.msg)
	}
	if r := outcome(func(t testing.TB) { Missing(t, "kube-apiserver", "make k8s-bins", "GPURACK_K8S_REQUIRED") }); !r.failed {
		t.Errorf("GPURACK_K8S_REQUIRED=1 named by the caller did not fail: %q", r.msg)
	}
}

// The opt-in skips stay skips under RequiredEnv=1 and say why.
func TestOptInSkipsStaySkips(t *testing.T) {
	clearRequired(t)
	t.Setenv(RequiredEnv, "1")
	r := outcome(func(t testing.TB) { OptIn(t, "GPURACK_TESTREQ_OPTIN", "it takes an hour") })
	if !r.skipped || r.failed || !strings.Contains(r.msg, "GPURACK_TESTREQ_OPTIN=1: it takes an hour") {
		t.Errorf("OptIn unset: skipped %v failed %v %q", r.skipped, r.failed, r.msg)
	}
	t.Setenv("GPURACK_TESTREQ_OPTIN", "1")
	if r := outcome(func(t testing.TB) { OptIn(t, "GPURACK_TESTREQ_OPTIN", "it takes an hour") }); r.skipped || r.failed {
		t.Errorf("OptIn set: stopped: %s", r.msg)
	}
	r = outcome(func(t testing.TB) { NotApplicable(t, "this machine has an NVIDIA driver") })
	if !r.skipped || r.failed || !strings.Contains(r.msg, "this machine has an NVIDIA driver") {
		t.Errorf("NotApplicable: skipped %v failed %v %q", r.skipped, r.failed, r.msg)
	}
}

// TestRealGoTestOutcome runs helperMissingTool in a child `go test` process, with a PATH
// that lacks the tool: the real testing package reports SKIP with the reason without
// RequiredEnv, and FAIL with what to install under RequiredEnv=1.
func TestRealGoTestOutcome(t *testing.T) {
	for _, c := range []struct {
		required string
		wantExit bool // a non-zero exit
		want     []string
	}{
		{"", false, []string{"--- SKIP: TestHelperMissingTool", "testreq: skipping: gpurack-no-such-tool is not in PATH; apt-get install gpurack-tools"}},
		{"1", true, []string{"--- FAIL: TestHelperMissingTool", "testreq: cannot run: gpurack-no-such-tool is not in PATH; apt-get install gpurack-tools (" + RequiredEnv + "=1"}},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMissingTool$", "-test.v")
		cmd.Env = append(os.Environ(), "GPURACK_TESTREQ_CHILD=1", RequiredEnv+"="+c.required, "PATH="+t.TempDir())
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if (err != nil) != c.wantExit || (err != nil && !errors.As(err, &ee)) {
			t.Errorf("%s=%q: exit %v, want a failing exit %v\n%s", RequiredEnv, c.required, err, c.wantExit, out)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s=%q: output lacks %q:\n%s", RequiredEnv, c.required, w, out)
			}
		}
	}
}

// TestHelperMissingTool is the child of TestRealGoTestOutcome; on its own it does nothing.
func TestHelperMissingTool(t *testing.T) {
	if os.Getenv("GPURACK_TESTREQ_CHILD") != "1" {
		return
	}
	Tool(t, "gpurack-no-such-tool", "apt-get install gpurack-tools")
	t.Error("Tool returned for a tool that is not in PATH")
}

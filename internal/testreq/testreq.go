// Package testreq decides, in one place, what a test does when this machine lacks
// something the test needs: a tool, a file, root, a kernel facility, a pinned binary.
//
// Without GPURACK_NETNS_REQUIRED it skips the test, saying what is missing and how to
// get it. With GPURACK_NETNS_REQUIRED=1, which `make test` (and so CI) sets, it fails
// the test with the same words: there every tool a test needs is required, so no part
// of the product can pass by not running.
//
// Opt-in extras are the exception and stay skips whatever the environment: Short (the
// test's -short mode), OptIn (an environment switch such as GPURACK_E2E_SLOW for long
// tests outside `make test`) and NotApplicable (the test's premise does not hold on
// this machine, such as an NVIDIA driver being present for a no-driver test). Each
// prints why.
//
// Tests call these instead of t.Skip; TestNoDirectSkips keeps it that way. The package
// is for tests only and imports nothing of gpurack.
package testreq

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// RequiredEnv names the environment variable that turns every skip for something
// missing into a failure. `make test` sets it to "1".
const RequiredEnv = "GPURACK_NETNS_REQUIRED"

// Required reports whether RequiredEnv, or any of alsoRequiredBy, is set to "1".
func Required(alsoRequiredBy ...string) bool {
	for _, env := range append([]string{RequiredEnv}, alsoRequiredBy...) {
		if os.Getenv(env) == "1" {
			return true
		}
	}
	return false
}

// Missing stops t because this machine lacks something: what says what is missing
// ("qemu-system-x86_64 is not in PATH"), howToGet what fixes it ("apt-get install
// qemu-system-x86; hack/deps.sh installs it"). It skips t, or fails it when Required
// (alsoRequiredBy names further variables that require it, such as
// GPURACK_K8S_REQUIRED for the control-plane tests). It does not return.
func Missing(t testing.TB, what, howToGet string, alsoRequiredBy ...string) {
	t.Helper()
	if Required(alsoRequiredBy...) {
		t.Fatalf("testreq: cannot run: %s; %s (%s=1: what a test needs must be here)", what, howToGet, RequiredEnv)
	}
	t.Skipf("testreq: skipping: %s; %s (with %s=1 this fails)", what, howToGet, RequiredEnv)
}

// Tool returns the path of the program name in PATH, or stops t with Missing, naming
// howToGet.
func Tool(t testing.TB, name, howToGet string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, fmt.Sprintf("%s is not in PATH", name), howToGet)
	}
	return p
}

// File stops t with Missing unless path exists.
func File(t testing.TB, path, howToGet string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, fmt.Sprintf("%s is missing (%v)", path, err), howToGet)
	}
}

// Root stops t with Missing unless the process runs as root; why says what needs it.
func Root(t testing.TB, why string) {
	t.Helper()
	if euid := os.Geteuid(); euid != 0 {
		Missing(t, fmt.Sprintf("%s needs root and this runs as uid %d", why, euid), "run the tests as root (sudo go test, or as root in a privileged container)")
	}
}

// Short skips t under go test -short, saying what -short leaves out. It is an opt-in
// skip: it never fails.
func Short(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("testreq: skipping under -short: %s", what)
	}
}

// OptIn skips t unless env is set (to anything but ""); why says why the test is opt-in and how to
// run it ("the NVIDIA images take many minutes each; make e2e-slow runs them"). It never
// fails: such tests are outside `make test` by design.
func OptIn(t testing.TB, env, why string) {
	t.Helper()
	if os.Getenv(env) == "" {
		t.Skipf("testreq: skipping unless %s=1: %s", env, why)
	}
}

// NotApplicable skips t because what it tests cannot happen on this machine: why says
// which premise does not hold ("this machine has an NVIDIA driver, so the no-driver
// path cannot be reached"). It never fails: nothing can be installed to change it.
// Do not use it for something missing; that is Missing.
func NotApplicable(t testing.TB, why string) {
	t.Helper()
	t.Skipf("testreq: not applicable here: %s", why)
}

//go:build linux

package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

// RequiredEnv names the environment variable that turns Require's skip into
// a failure. CI machines that are meant to run the namespace tests set it to
// "1", so a lost privilege shows up as a red test instead of a quiet skip.
// internal/testreq makes that decision, for every test.
const RequiredEnv = testreq.RequiredEnv

// Capability bit numbers from linux/capability.h.
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// Require skips t, printing the reason, unless this process can create
// network namespaces: it must run on Linux as root with CAP_NET_ADMIN and
// CAP_SYS_ADMIN, and the ip tool must be in PATH. With RequiredEnv=1 it
// fails t instead of skipping. New calls Require.
func Require(t testing.TB) {
	t.Helper()
	reason := missingPrivilege()
	if reason == "" {
		return
	}
	testreq.Missing(t, "a network namespace test cannot run here", reason)
}

// missingPrivilege returns why namespace tests cannot run here, or "".
func missingPrivilege() string {
	if euid := os.Geteuid(); euid != 0 {
		return fmt.Sprintf("it needs root and runs as uid %d (run `sudo go test`, or as root in a privileged container)", euid)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the ip tool is not in PATH (install iproute2)"
	}
	caps, err := effectiveCapabilities()
	if err != nil {
		return fmt.Sprintf("its capabilities cannot be read: %v", err)
	}
	for _, c := range []struct {
		bit  uint
		name string
	}{{capNetAdmin, "CAP_NET_ADMIN"}, {capSysAdmin, "CAP_SYS_ADMIN"}} {
		if caps&(1<<c.bit) == 0 {
			return fmt.Sprintf("root lacks %s (an unprivileged container? run it with --privileged)", c.name)
		}
	}
	return ""
}

// effectiveCapabilities returns the CapEff mask from /proc/self/status.
func effectiveCapabilities() (uint64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff line in /proc/self/status")
}

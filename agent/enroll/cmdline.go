// Package enroll is the agent's side of gpuboot's enrollment (CONTRACTS §2): it finds
// gpuboot and its CA pin on the kernel command line, keeps the agent's ed25519 key,
// registers with backoff until an operator (or policy) approves, redeems the one-time
// token for the JoinBundle, reports the commissioning checklist and heartbeats.
//
// It does not configure kubelet or touch the Node object (package kubejoin does), and
// it decides nothing about health: callers hand it checklists and health summaries.
package enroll

import (
	"fmt"
	"net"
	"strings"

	"github.com/gpurack/gpurack/internal/pki"
)

// Kernel command line keys gpuboot's iPXE script appends (CONTRACTS §3).
const (
	CmdlineEndpoint = "gpurack.enroll"
	CmdlineCA       = "gpurack.enroll.ca"
)

// Target is where to enroll: gpuboot's TLS listener and the pin of the gpurack CA.
type Target struct {
	Endpoint string // host:port
	Pin      string // sha256:HEX over the CA's DER SubjectPublicKeyInfo
}

// ParseCmdline reads gpurack.enroll and gpurack.enroll.ca from a kernel command line
// (/proc/cmdline contents). A key given twice takes its last value, as the kernel does
// for its own parameters. Either may be absent; values are not checked here (see
// Target.Validate).
func ParseCmdline(cmdline string) Target {
	var t Target
	for _, f := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		switch k {
		case CmdlineEndpoint:
			t.Endpoint = v
		case CmdlineCA:
			t.Pin = v
		}
	}
	return t
}

// Resolve combines the command line with the --enroll and --enroll-ca flags, which
// override it key by key. ok is false when the agent should not enroll (no endpoint).
func Resolve(cmdline, flagEndpoint, flagPin string) (t Target, ok bool, err error) {
	t = ParseCmdline(cmdline)
	if flagEndpoint != "" {
		t.Endpoint = flagEndpoint
	}
	if flagPin != "" {
		t.Pin = flagPin
	}
	if t.Endpoint == "" {
		if t.Pin != "" {
			return t, false, fmt.Errorf("%s is set but %s (or --enroll) is not: no gpuboot to enroll with", CmdlineCA, CmdlineEndpoint)
		}
		return t, false, nil
	}
	return t, true, t.Validate()
}

// Validate checks that the endpoint is host:port and the pin is well formed. Without a
// pin the agent cannot authenticate gpuboot, so it refuses to enroll.
func (t Target) Validate() error {
	host, port, err := net.SplitHostPort(t.Endpoint)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("enroll endpoint %q: want host:port of gpuboot's TLS listener (%s=HOST:8443)", t.Endpoint, CmdlineEndpoint)
	}
	if t.Pin == "" {
		return fmt.Errorf("enroll endpoint %s has no CA pin: set %s=sha256:HEX on the kernel command line or --enroll-ca (gpuboot init prints it)", t.Endpoint, CmdlineCA)
	}
	if err := pki.ValidatePin(t.Pin); err != nil {
		return fmt.Errorf("enroll CA pin %q: %w", t.Pin, err)
	}
	return nil
}

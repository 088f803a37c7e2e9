// Package bmc controls a machine's power through its baseboard management controller,
// over Redfish (DMTF DSP0266): it reads a ComputerSystem's PowerState and POSTs its
// #ComputerSystem.Reset action, then follows the action to completion (the BMC's Task,
// when it answers 202 Accepted, and then the PowerState it reports).
//
// Every call opens one Redfish session (SessionService, X-Auth-Token), does its work and
// deletes the session, so a BMC's small session table does not fill up. A failure is
// never retried: one attempt per call, and the only loops are the polls for completion,
// each bounded by a timeout. Errors name the BMC and say what to fix.
//
// The Redfish wire format comes from github.com/stmcginnis/gofish; this package decides
// which ResetType to send (plan.go, a pure function) and how long to wait. Credentials
// holds gpuboot's BMC accounts (bmc-credentials.yaml in its state directory, never the
// rack manifest) and makes the Endpoint for a machine's BMC address and rack. It is not
// the operator command (pxe/cmd/gpuboot, pxe/admin, pxe/enroll). redfishtest is a
// Redfish service for tests.
package bmc

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Endpoint is one BMC and the credentials to reach it.
type Endpoint struct {
	// Address is the BMC's Redfish service, "https://host[:port]", without a path.
	Address string
	// Username and Password are the BMC account's credentials.
	Username, Password string
	// Insecure skips verifying the BMC's TLS certificate (many BMCs ship self-signed
	// ones); CAPEM, when set, is the PEM bundle the certificate must chain to instead
	// of the host's roots.
	Insecure bool
	CAPEM    []byte
	// CredentialsSource says where Username and Password came from, for the error a
	// refused login returns ("bmc-credentials.yaml in gpuboot's state directory, rack
	// r1"). Empty means gpuboot's state.
	CredentialsSource string
}

// Action is what Power does to a machine.
type Action string

// The actions Power takes.
const (
	// ActionOn powers the machine on (ResetType On, or ForceOn); a machine already on
	// is left alone.
	ActionOn Action = "on"
	// ActionOff powers the machine off at once (ResetType ForceOff), without asking the
	// OS to shut down; a machine already off is left alone.
	ActionOff Action = "off"
	// ActionCycle power-cycles the machine (ResetType PowerCycle, or ForceOff then On
	// where the BMC does not offer PowerCycle). A machine that is off is powered on.
	ActionCycle Action = "cycle"
	// ActionStatus only reads the PowerState.
	ActionStatus Action = "status"
)

// Actions lists the actions in the order the operator command shows them.
var Actions = []Action{ActionOn, ActionOff, ActionCycle, ActionStatus}

// ParseAction returns the Action named s ("on", "off", "cycle", "status").
func ParseAction(s string) (Action, error) {
	for _, a := range Actions {
		if string(a) == strings.ToLower(strings.TrimSpace(s)) {
			return a, nil
		}
	}
	names := make([]string, len(Actions))
	for i, a := range Actions {
		names[i] = string(a)
	}
	return "", fmt.Errorf("unknown power action %q: use one of %s", s, strings.Join(names, ", "))
}

// PowerState is a ComputerSystem's PowerState as the BMC reports it: On, Off,
// PoweringOn, PoweringOff, Paused.
type PowerState string

// The power states Power waits for.
const (
	PowerOn  PowerState = "On"
	PowerOff PowerState = "Off"
)

// Options bound how long Power waits. The zero value means the defaults.
type Options struct {
	// Timeout bounds the wait for the PowerState to reach the expected one after each
	// Reset (default 2 minutes).
	Timeout time.Duration
	// TaskTimeout bounds the wait for a BMC Task to end when the BMC answers a Reset
	// with 202 Accepted (default 2 minutes).
	TaskTimeout time.Duration
	// PollInterval is the time between two reads of a Task or of the PowerState
	// (default 2 seconds).
	PollInterval time.Duration
	// RequestTimeout bounds one HTTP request, connecting included (default 30 seconds),
	// so an unreachable BMC fails in bounded time.
	RequestTimeout time.Duration
}

// Defaults for Options.
const (
	DefaultTimeout        = 2 * time.Minute
	DefaultPollInterval   = 2 * time.Second
	DefaultRequestTimeout = 30 * time.Second
)

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.TaskTimeout <= 0 {
		o.TaskTimeout = DefaultTimeout
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	return o
}

// Result is what Power did and what the BMC said.
type Result struct {
	// Address is the BMC, System the ComputerSystem's Id.
	Address, System string
	Action          Action
	// Before is the PowerState before any Reset, PowerState the last one read.
	Before, PowerState PowerState
	// Resets are the Reset actions sent, in order; none when the machine already was
	// in the state asked for, or for ActionStatus.
	Resets []Reset
	// Elapsed is the time from the first request to the last.
	Elapsed time.Duration
	// LogoutError is set when deleting the Redfish session failed; the action itself
	// is not affected (the BMC expires the session).
	LogoutError string
}

// Reset is one #ComputerSystem.Reset POST and how it ended.
type Reset struct {
	ResetType string
	// HTTPStatus is the BMC's answer to the POST (200, 202, 204).
	HTTPStatus int
	// Task is the task monitor the BMC named in its 202 answer; TaskState the state the
	// task ended in (Completed, Exception, ...), TaskMessages what it said.
	Task         string
	TaskState    string
	TaskMessages []string
	// Expect is the PowerState waited for, Reached whether it was reached.
	Expect  PowerState
	Reached bool
	Elapsed time.Duration
}

// Kind classifies an Error, so callers can map it (to a gRPC code, an exit status).
type Kind int

// The kinds of Error.
const (
	// KindInvalid: the request or the Endpoint is malformed.
	KindInvalid Kind = iota + 1
	// KindUnreachable: the BMC did not answer (connection, DNS, TLS).
	KindUnreachable
	// KindCredentials: the BMC refused the credentials (401) or the privilege (403).
	KindCredentials
	// KindUnsupported: the system has no Reset action, or does not allow the ResetType.
	KindUnsupported
	// KindNotFound: the system is not on the BMC, or the choice is ambiguous.
	KindNotFound
	// KindTimeout: a Task or the PowerState did not finish in time.
	KindTimeout
	// KindFailed: the BMC answered with an error, or its Task ended in an exception.
	KindFailed
)

// Error is every error this package returns; its message names the BMC and says
// what to fix.
type Error struct {
	Kind Kind
	Msg  string
	Err  error
	// located: Msg already names the BMC (and withBMC leaves it alone).
	located bool
}

func (e *Error) Error() string { return e.Msg }

func (e *Error) Unwrap() error { return e.Err }

func errorf(kind Kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// KindOf returns the Kind of err, or 0 when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

// Package checks evaluates a GPU snapshot against a node profile: one pure function per
// check (one file each), registered in one table (registry.go), each returning results
// with an id from CONTRACTS §9, a status, what was observed and expected, and a remedy.
//
// Checks do no I/O: the snapshot (agent/gpu/snapshot; checks never import NVML), the XID history (agent/xid), the rack's
// figures (agent/gossip) and the clock are inputs. Thresholds come from the profile's
// `checks:` section; each check's defaults and their published sources are in the
// registry. Turning results into health and Node conditions is agent/health's job.
package checks

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

// Status is a check's verdict (CONTRACTS §9).
type Status int

// The statuses, ordered so that a larger value is not worse; see Worse.
const (
	NotApplicable Status = iota
	Pass
	Unknown
	Warn
	Fail
)

var statusNames = [...]string{"not-applicable", "pass", "unknown", "warn", "fail"}

// String is the text form used by reports, metrics labels and alerts.
func (s Status) String() string {
	if s < 0 || int(s) >= len(statusNames) {
		return "unknown"
	}
	return statusNames[s]
}

// ParseStatus is the inverse of String.
func ParseStatus(s string) (Status, bool) {
	i := slices.Index(statusNames[:], s)
	return Status(i), i >= 0
}

// Worse reports whether a is worse than b: fail > warn > unknown > pass >
// not-applicable (the order of Checklist.overall).
func Worse(a, b Status) bool { return a > b }

// Result is one check's verdict on the node or on one GPU.
type Result struct {
	ID     checkid.ID
	Status Status
	// GPU is the NVML index of the GPU the result is about, or -1 for a node-level
	// result.
	GPU     int
	GPUUUID string
	// Observed and Expected are short, human-readable, with units.
	Observed, Expected string
	// Remedy is one imperative sentence for an operator; empty for pass and
	// not-applicable.
	Remedy string
	// Message is one sentence explaining the status.
	Message string
}

// Phase says why the checklist runs; a few checks judge differently at commissioning
// (an idle node) and while workloads run.
type Phase int

// The phases.
const (
	// Commissioning: the node is idle and must be clean (validate, pre-approval and
	// commissioning checklists).
	Commissioning Phase = iota
	// Continuous: periodic checks while workloads may run.
	Continuous
)

// XIDEvent is one XID error as agent/xid records it.
type XIDEvent struct {
	GPU   int // NVML index, -1 when the PCI id matched no GPU
	Code  uint32
	Class string
	Fatal bool
	// Application is true for XIDs caused by user programs (not counted by
	// gpu.xid.recent).
	Application bool
	At          time.Time
}

// Figures are the per-node numbers peers compare (rack.peer-outlier).
type Figures struct {
	// MaxTemperatureC is the hottest GPU's temperature.
	MaxTemperatureC float64
	// PCIeReplaysPerMin is the node's summed PCIe replay rate; NaN when unknown.
	PCIeReplaysPerMin float64
	// ECCCorrectedPerHour is the node's summed corrected-ECC rate; NaN when unknown.
	ECCCorrectedPerHour float64
}

// Peer is another rack member's figures, from gossip.
type Peer struct {
	Node    string
	Figures Figures
}

// Input is everything checks read.
type Input struct {
	Snapshot *snapshot.Snapshot
	// Previous is an earlier snapshot of the same node, for rates; nil for a single
	// run (validate).
	Previous *snapshot.Snapshot
	// Profile supplies expectations and threshold overrides. Required.
	Profile *profile.Profile
	Phase   Phase
	// XIDs are the XID errors recorded since boot (or the GPU's last reset), oldest
	// first.
	XIDs []XIDEvent
	// Peers are the other alive rack members' figures.
	Peers []Peer
	// Now is the evaluation time (for the recent-XID window).
	Now time.Time
	// Compute is the latest compute check's report (gpu.compute), measured at
	// commissioning when the profile turns it on; nil when not measured.
	Compute *gpucompute.Report
}

// Limits are a check's thresholds; NaN means unset. Their unit is the check's (see
// Check.Unit).
type Limits struct{ Warn, Fail float64 }

var unset = math.NaN()

func isSet(f float64) bool { return !math.IsNaN(f) }

// limits merges the profile's overrides into the check's defaults.
func (in *Input) limits(c *Check) Limits {
	l := c.Defaults
	if in.Profile == nil {
		return l
	}
	if o, ok := in.Profile.Checks[string(c.ID)]; ok {
		if o.Warn != nil {
			l.Warn = *o.Warn
		}
		if o.Fail != nil {
			l.Fail = *o.Fail
		}
	}
	return l
}

func (in *Input) disabled(id checkid.ID) bool {
	if in.Profile == nil {
		return false
	}
	o, ok := in.Profile.Checks[string(id)]
	return ok && o.Disabled
}

// expect returns the profile's GPU expectations, or nil without a gpu section.
func (in *Input) expect() *profile.Expect {
	if in.Profile == nil || in.Profile.GPU == nil {
		return nil
	}
	return &in.Profile.GPU.Expect
}

// Check is one registered check.
type Check struct {
	ID checkid.ID
	// PerGPU checks return one result per GPU; the others one node-level result.
	PerGPU bool
	// Defaults are used where the profile sets no override.
	Defaults Limits
	// Unit says what Warn and Fail measure, for docs and profile authors.
	Unit string
	// Source cites where the default comes from.
	Source string
	// eval is the pure function. Per-GPU checks get each GPU; node checks get nil.
	eval func(in *Input, c *Check, l Limits, g *snapshot.GPU) Result
}

// Run evaluates the checks named by ids (all registered checks when ids is empty), in
// the order of checkid.All, per-GPU results by GPU index.
func Run(in *Input, ids ...checkid.ID) []Result {
	var out []Result
	for i := range Registry {
		c := &Registry[i]
		if len(ids) > 0 && !slices.Contains(ids, c.ID) {
			continue
		}
		out = append(out, c.Run(in)...)
	}
	return out
}

// Run evaluates one check.
func (c *Check) Run(in *Input) []Result {
	node := func(st Status, msg string) []Result {
		return []Result{{ID: c.ID, Status: st, GPU: -1, Message: msg}}
	}
	switch {
	case in.disabled(c.ID):
		return node(NotApplicable, "disabled by the profile's checks section")
	case in.Profile == nil:
		return node(Unknown, "no profile loaded")
	case in.Profile.GPU == nil:
		return node(NotApplicable, fmt.Sprintf("profile %s has no gpu section", in.Profile.Name))
	case c.ID != checkid.DriverLoaded && c.ID != checkid.RackPeerOutlier && !in.Snapshot.Driver.Loaded:
		return []Result{{ID: c.ID, Status: Unknown, GPU: -1, Message: "GPU backend not readable: " + in.Snapshot.Driver.Error,
			Remedy: "Fix gpu.driver.loaded first."}}
	}
	l := in.limits(c)
	if !c.PerGPU {
		r := c.eval(in, c, l, nil)
		r.ID, r.GPU = c.ID, -1
		return []Result{r}
	}
	if len(in.Snapshot.GPUs) == 0 {
		return node(NotApplicable, "no GPUs enumerated (see gpu.count)")
	}
	out := make([]Result, 0, len(in.Snapshot.GPUs))
	for i := range in.Snapshot.GPUs {
		g := &in.Snapshot.GPUs[i]
		var r Result
		if g.Lost && c.ID != checkid.XIDFatal {
			r = Result{Status: Unknown, Message: fmt.Sprintf("GPU %d is lost (ERROR_GPU_IS_LOST); see gpu.xid.fatal", g.Index),
				Remedy: "Reset the GPU or reboot the node."}
		} else {
			r = c.eval(in, c, l, g)
		}
		r.ID, r.GPU, r.GPUUUID = c.ID, g.Index, g.UUID
		out = append(out, r)
	}
	return out
}

// Overall is the worst status among results; not-applicable when there are none.
func Overall(rs []Result) Status {
	worst := NotApplicable
	for _, r := range rs {
		if Worse(r.Status, worst) {
			worst = r.Status
		}
	}
	return worst
}

// Find returns the registered check with the id.
func Find(id checkid.ID) *Check {
	for i := range Registry {
		if Registry[i].ID == id {
			return &Registry[i]
		}
	}
	return nil
}

// unknownFrom is the result for a reading that failed: not-applicable when the GPU or
// driver does not offer it, unknown otherwise.
func unknownFrom[T any](v snapshot.Value[T], what string) Result {
	if v.NotSupported {
		return Result{Status: NotApplicable, Message: what + " not supported: " + v.Err}
	}
	return Result{Status: Unknown, Message: what + " could not be read: " + v.Err,
		Remedy: "Check the driver with nvidia-smi -q; re-run the checks."}
}

func pass(observed, expected, msg string) Result {
	return Result{Status: Pass, Observed: observed, Expected: expected, Message: msg}
}

// fmtLimit prints a threshold without a trailing ".0".
func fmtLimit(f float64) string { return fmt.Sprintf("%g", f) }

// gpuName is "GPU i" for messages.
func gpuName(g *snapshot.GPU) string { return fmt.Sprintf("GPU %d (%s)", g.Index, g.PCIBusID) }

// MarkdownTable renders the registry (ids, scope, default thresholds, units,
// sources) for docs/agent.md; a test keeps the two equal.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| id | scope | default warn | default fail | unit | source |\n|---|---|---|---|---|---|\n")
	lim := func(f float64) string {
		if !isSet(f) {
			return "–"
		}
		return fmtLimit(f)
	}
	for _, c := range Registry {
		scope := "node"
		if c.PerGPU {
			scope = "GPU"
		}
		unit := c.Unit
		if unit == "" {
			unit = "–"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", c.ID, scope, lim(c.Defaults.Warn), lim(c.Defaults.Fail), unit, c.Source)
	}
	return b.String()
}

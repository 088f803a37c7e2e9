// Package health condenses check results into the node's HealthSummary (what
// Heartbeat, gossip, Status, metrics and the GPUHealthy Node condition carry) and
// keeps hysteresis so that one good reading does not clear a problem: a worse state is
// adopted at once, a better one only after it has held for a while (CONTRACTS §5:
// "hysteresis delays only the clearing").
package health

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/internal/checkid"
)

// State is the node's health.
type State int

// The states, in the order of gpurack.machine.v1.HealthState.
const (
	Unknown State = iota
	Healthy
	Degraded
	Unhealthy
)

func (s State) String() string {
	return [...]string{"unknown", "healthy", "degraded", "unhealthy"}[s]
}

// severity orders states for hysteresis: healthy < degraded < unknown < unhealthy.
func (s State) severity() int { return [...]int{2, 0, 1, 3}[s] }

// Summary is one health summary.
type Summary struct {
	State State
	// Failing and Warning are check ids, deduplicated and sorted.
	Failing, Warning []string
	GPUCount         int
	HealthyGPUs      int
	// UnhealthyGPUs are indexes of GPUs with a failing GPU-level result, sorted.
	UnhealthyGPUs []int
	// GPUHealthy, Reason and Message are the GPUHealthy Node condition.
	GPUHealthy bool
	Reason     string
	Message    string
	UpdatedAt  time.Time
}

// Same reports whether a and b say the same thing (ignoring UpdatedAt).
func (a Summary) Same(b Summary) bool {
	return a.State == b.State && slices.Equal(a.Failing, b.Failing) && slices.Equal(a.Warning, b.Warning) &&
		a.GPUHealthy == b.GPUHealthy && a.Reason == b.Reason && slices.Equal(a.UnhealthyGPUs, b.UnhealthyGPUs) &&
		a.HealthyGPUs == b.HealthyGPUs && a.GPUCount == b.GPUCount
}

// NotRun is the summary before the first checklist.
func NotRun(at time.Time) Summary {
	return Summary{State: Unknown, Reason: "ChecksNotRun", Message: "No checklist has completed yet.", UpdatedAt: at}
}

// Summarize is the pure summary of one checklist's results; gpuCount is the number of
// GPUs the backend enumerated.
func Summarize(rs []checks.Result, gpuCount int, at time.Time) Summary {
	s := Summary{GPUCount: gpuCount, UpdatedAt: at}
	bad := map[int]bool{}
	var failMsgs []string
	unknown := 0
	for _, r := range rs {
		switch r.Status {
		case checks.Fail:
			s.Failing = append(s.Failing, string(r.ID))
			if r.GPU >= 0 {
				bad[r.GPU] = true
			}
			failMsgs = append(failMsgs, r.Message)
		case checks.Warn:
			s.Warning = append(s.Warning, string(r.ID))
		case checks.Unknown:
			unknown++
		}
	}
	s.Failing, s.Warning = sortUniq(s.Failing), sortUniq(s.Warning)
	for g := range bad {
		s.UnhealthyGPUs = append(s.UnhealthyGPUs, g)
	}
	slices.Sort(s.UnhealthyGPUs)
	s.HealthyGPUs = max(gpuCount-len(s.UnhealthyGPUs), 0)
	switch {
	case len(s.Failing) > 0:
		s.State, s.GPUHealthy = Unhealthy, false
		s.Reason = Reason(checkid.ID(s.Failing[0]))
		if slices.Contains(s.Failing, string(checkid.DriverLoaded)) {
			s.Reason = "BackendUnavailable"
		}
		s.Message = failMessage(s, failMsgs)
	case len(s.Warning) > 0 || unknown > 0:
		s.State, s.GPUHealthy, s.Reason = Degraded, true, "ChecksWarning"
		s.Message = fmt.Sprintf("GPUs usable; %d checks warn (%s), %d could not be evaluated.", len(s.Warning), strings.Join(s.Warning, ", "), unknown)
	default:
		s.State, s.GPUHealthy, s.Reason = Healthy, true, "AllChecksPassed"
		s.Message = fmt.Sprintf("All checks passed on %d GPUs.", gpuCount)
		if gpuCount == 0 {
			s.Message = "No GPU checks apply to this node."
		}
	}
	return s
}

func failMessage(s Summary, msgs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d GPUs unhealthy; failing: %s.", len(s.UnhealthyGPUs), s.GPUCount, strings.Join(s.Failing, ", "))
	if len(msgs) > 0 {
		b.WriteString(" " + msgs[0])
		if len(msgs) > 1 {
			fmt.Fprintf(&b, " (+%d more)", len(msgs)-1)
		}
	}
	return b.String()
}

// Reason turns a check id into a condition reason: "gpu.xid.fatal" → "XidFatal",
// "gpu.row-remap.pending" → "RowRemapPending".
func Reason(id checkid.ID) string {
	s := strings.TrimPrefix(string(id), "gpu.")
	var b strings.Builder
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' }) {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

func sortUniq(xs []string) []string {
	slices.Sort(xs)
	return slices.Compact(xs)
}

// Tracker applies hysteresis. The zero value clears at once; set ClearAfter.
type Tracker struct {
	// ClearAfter is how long a better summary must hold before it replaces a worse
	// one.
	ClearAfter time.Duration

	cur         Summary
	started     bool
	betterSince time.Time
}

// Update offers a new raw summary and returns the published one and whether it
// changed.
func (t *Tracker) Update(raw Summary) (Summary, bool) {
	if !t.started {
		t.started, t.cur = true, raw
		return raw, true
	}
	better := raw.State.severity() < t.cur.State.severity()
	if !better {
		t.betterSince = time.Time{}
		changed := !raw.Same(t.cur)
		t.cur = raw
		return raw, changed
	}
	if t.betterSince.IsZero() {
		t.betterSince = raw.UpdatedAt
	}
	if raw.UpdatedAt.Sub(t.betterSince) < t.ClearAfter {
		return t.cur, false
	}
	t.betterSince = time.Time{}
	t.cur = raw
	return raw, true
}

// Current returns the published summary.
func (t *Tracker) Current() Summary { return t.cur }

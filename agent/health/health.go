// Package health condenses check results into the node's HealthSummary (what
// Heartbeat, gossip, Status, metrics and the GPUHealthy Node condition carry) and
// keeps hysteresis so that one good reading does not clear a problem: a worse state is
// adopted at once, a better one only after it has held for a while (CONTRACTS §5:
// "hysteresis delays only the clearing").
package health

import (
	"cmp"
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
	// NodeState is the state whole-node results alone give (withdrawn GPUs not
	// counted): what the node-level hysteresis compares.
	NodeState State
	// Failing and Warning are check ids, deduplicated and sorted.
	Failing, Warning []string
	GPUCount         int
	HealthyGPUs      int
	// UnhealthyGPUs are indexes of GPUs with a failing GPU-level result (withdrawn or
	// not), sorted: the GPUs the device plugin reports Unhealthy.
	UnhealthyGPUs []int
	// Withdrawn are the GPUs taken out of service alone, sorted by index: a per-GPU
	// failure (see Withdraws) costs that GPU, not the node (decision 0630).
	Withdrawn []Withdrawal
	// GPUHealthy, Reason and Message are the GPUHealthy Node condition.
	GPUHealthy bool
	Reason     string
	Message    string
	UpdatedAt  time.Time

	// What the text is recomposed from when the tracker holds a GPU back.
	nodeBadGPUs []int    // GPUs with a failing whole-node result
	failMsgs    []string // messages of the failing whole-node results
	unknown     int      // results that could not be evaluated
}

// Withdrawal is one GPU out of service on its own.
type Withdrawal struct {
	GPU int
	// Reason names the failing checks and what they saw; it starts with "clearing:"
	// while the GPU has recovered but the hysteresis still holds it.
	Reason string
}

// ReasonGPUsWithdrawn is the GPUHealthy reason (status True) while GPUs are withdrawn
// and no whole-node check fails.
const ReasonGPUsWithdrawn = "GPUsWithdrawn"

// Withdraws reports whether a failing result takes only its GPU out of service rather
// than the node (decision 0630): a fatal XID on that GPU (the profile's
// gpu.xid.withdraw; a lost GPU counts as XID 79), an uncorrectable ECC error, or a
// pending row remap. Each of these is one GPU's memory or state, fixed by resetting
// or replacing that GPU while its neighbours keep working. Every other failure —
// driver, count, product, VBIOS mismatch, PCIe, NVLink, fabric, temperature,
// processes — says something about the node or its build, and taints it.
func Withdraws(r checks.Result) bool {
	if r.Status != checks.Fail || r.GPU < 0 {
		return false
	}
	switch r.ID {
	case checkid.XIDFatal, checkid.ECCUncorrected, checkid.RowRemapPending:
		return true
	}
	return false
}

// Same reports whether a and b say the same thing (ignoring UpdatedAt and the text).
func (a Summary) Same(b Summary) bool {
	return a.State == b.State && a.NodeState == b.NodeState && slices.Equal(a.Failing, b.Failing) && slices.Equal(a.Warning, b.Warning) &&
		a.GPUHealthy == b.GPUHealthy && a.Reason == b.Reason && slices.Equal(a.UnhealthyGPUs, b.UnhealthyGPUs) &&
		a.HealthyGPUs == b.HealthyGPUs && a.GPUCount == b.GPUCount && slices.Equal(a.WithdrawnGPUs(), b.WithdrawnGPUs())
}

// WithdrawnGPUs are the indexes of the withdrawn GPUs, sorted.
func (a Summary) WithdrawnGPUs() []int {
	out := make([]int, len(a.Withdrawn))
	for i, w := range a.Withdrawn {
		out[i] = w.GPU
	}
	return out
}

// NotRun is the summary before the first checklist.
func NotRun(at time.Time) Summary {
	return Summary{State: Unknown, NodeState: Unknown, Reason: "ChecksNotRun", Message: "No checklist has completed yet.", UpdatedAt: at}
}

// Summarize is the pure summary of one checklist's results; gpuCount is the number of
// GPUs the backend enumerated.
func Summarize(rs []checks.Result, gpuCount int, at time.Time) Summary {
	s := Summary{GPUCount: gpuCount, UpdatedAt: at}
	withdrawn := map[int][]string{}
	var nodeFailing []string
	for _, r := range rs {
		switch r.Status {
		case checks.Fail:
			s.Failing = append(s.Failing, string(r.ID))
			switch {
			case Withdraws(r):
				withdrawn[r.GPU] = append(withdrawn[r.GPU], string(r.ID)+": "+r.Message)
				continue
			case r.GPU >= 0:
				s.nodeBadGPUs = append(s.nodeBadGPUs, r.GPU)
			}
			nodeFailing = append(nodeFailing, string(r.ID))
			s.failMsgs = append(s.failMsgs, r.Message)
		case checks.Warn:
			s.Warning = append(s.Warning, string(r.ID))
		case checks.Unknown:
			s.unknown++
		}
	}
	s.Failing, s.Warning, nodeFailing = sortUniq(s.Failing), sortUniq(s.Warning), sortUniq(nodeFailing)
	s.nodeBadGPUs = sortUniq(s.nodeBadGPUs)
	switch {
	case len(nodeFailing) > 0:
		s.NodeState, s.Reason = Unhealthy, Reason(checkid.ID(nodeFailing[0]))
		if slices.Contains(nodeFailing, string(checkid.DriverLoaded)) {
			s.Reason = "BackendUnavailable"
		}
	case len(s.Warning) > 0 || s.unknown > 0:
		s.NodeState = Degraded
	default:
		s.NodeState = Healthy
	}
	var ws []Withdrawal
	for g, why := range withdrawn {
		ws = append(ws, Withdrawal{GPU: g, Reason: strings.Join(why, "; ")})
	}
	return s.withWithdrawn(ws)
}

// withWithdrawn is s with ws as its withdrawn GPUs and what follows from them: the
// unhealthy GPU list, the count of healthy ones, and the state and condition text.
func (s Summary) withWithdrawn(ws []Withdrawal) Summary {
	s.Withdrawn = slices.Clone(ws)
	slices.SortFunc(s.Withdrawn, func(a, b Withdrawal) int { return a.GPU - b.GPU })
	s.UnhealthyGPUs = sortUniq(append(slices.Clone(s.nodeBadGPUs), s.WithdrawnGPUs()...))
	s.HealthyGPUs = max(s.GPUCount-len(s.UnhealthyGPUs), 0)
	switch {
	case s.NodeState == Unhealthy:
		s.State, s.GPUHealthy = Unhealthy, false
		s.Message = failMessage(s, s.failMsgs)
	case len(s.Withdrawn) > 0:
		s.State, s.GPUHealthy, s.Reason = Degraded, true, ReasonGPUsWithdrawn
		s.Message = withdrawnMessage(s)
	case s.NodeState == Degraded:
		s.State, s.GPUHealthy, s.Reason = Degraded, true, "ChecksWarning"
		s.Message = fmt.Sprintf("GPUs usable; %d checks warn (%s), %d could not be evaluated.", len(s.Warning), strings.Join(s.Warning, ", "), s.unknown)
	case s.NodeState == Unknown:
		s.State = Unknown
	default:
		s.State, s.GPUHealthy, s.Reason = Healthy, true, "AllChecksPassed"
		s.Message = fmt.Sprintf("All checks passed on %d GPUs.", s.GPUCount)
		if s.GPUCount == 0 {
			s.Message = "No GPU checks apply to this node."
		}
	}
	return s
}

func withdrawnMessage(s Summary) string {
	var b strings.Builder
	for i, w := range s.Withdrawn {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "GPU %d withdrawn (%s).", w.GPU, w.Reason)
	}
	fmt.Fprintf(&b, " The node keeps its other %d GPUs in service.", max(s.GPUCount-len(s.Withdrawn), 0))
	if len(s.Warning) > 0 {
		fmt.Fprintf(&b, " %d checks warn (%s).", len(s.Warning), strings.Join(s.Warning, ", "))
	}
	if s.unknown > 0 {
		fmt.Fprintf(&b, " %d results could not be evaluated.", s.unknown)
	}
	return b.String()
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

func sortUniq[T cmp.Ordered](xs []T) []T {
	slices.Sort(xs)
	return slices.Compact(xs)
}

// Tracker applies hysteresis at two levels. Whole-node: a summary whose NodeState is
// better than the published one replaces it only after that has held for ClearAfter.
// Per GPU: a withdrawn GPU stays withdrawn until the checks have not withdrawn it for
// ClearAfter. Anything worse (a node-level failure, a newly withdrawn GPU) is
// published at once. The zero value clears at once; set ClearAfter.
type Tracker struct {
	// ClearAfter is how long a better summary must hold before it replaces a worse
	// one.
	ClearAfter time.Duration

	cur         Summary
	started     bool
	betterSince time.Time
	gpuClearing map[int]time.Time // withdrawn GPUs the checks no longer withdraw, since when
}

// Update offers a new raw summary and returns the published one and whether it
// changed.
func (t *Tracker) Update(raw Summary) (Summary, bool) {
	if !t.started {
		t.started, t.cur = true, raw
		return raw, true
	}
	now := raw.UpdatedAt
	if t.gpuClearing == nil {
		t.gpuClearing = map[int]time.Time{}
	}
	// Per GPU: hold back GPUs that recovered less than ClearAfter ago.
	ws := slices.Clone(raw.Withdrawn)
	for _, w := range t.cur.Withdrawn {
		if slices.Contains(raw.WithdrawnGPUs(), w.GPU) {
			delete(t.gpuClearing, w.GPU)
			continue
		}
		since, ok := t.gpuClearing[w.GPU]
		if !ok {
			since, t.gpuClearing[w.GPU] = now, now
		}
		if now.Sub(since) < t.ClearAfter {
			if !strings.HasPrefix(w.Reason, "clearing: ") {
				w.Reason = "clearing: " + w.Reason
			}
			ws = append(ws, w)
		} else {
			delete(t.gpuClearing, w.GPU)
		}
	}
	for g := range t.gpuClearing {
		if !slices.ContainsFunc(t.cur.Withdrawn, func(w Withdrawal) bool { return w.GPU == g }) {
			delete(t.gpuClearing, g)
		}
	}
	next := raw.withWithdrawn(ws)
	// Whole node: a better node state waits ClearAfter; meanwhile only the GPU part
	// of the published summary moves.
	if raw.NodeState.severity() < t.cur.NodeState.severity() {
		if t.betterSince.IsZero() {
			t.betterSince = now
		}
		if now.Sub(t.betterSince) < t.ClearAfter {
			next = t.cur.withWithdrawn(ws)
			next.UpdatedAt = t.cur.UpdatedAt
			changed := !next.Same(t.cur)
			if changed {
				next.UpdatedAt = now
			}
			t.cur = next
			return next, changed
		}
	}
	t.betterSince = time.Time{}
	changed := !next.Same(t.cur)
	t.cur = next
	return next, changed
}

// Current returns the published summary.
func (t *Tracker) Current() Summary { return t.cur }

package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// eccUncorrected: volatile uncorrected ECC errors, against Fail (default 0).
func eccUncorrected(_ *Input, c *Check, l Limits, g *snapshot.GPU) Result {
	return counterCheck(g, g.ECCUncorrected, l, "uncorrected ECC errors", "since the driver loaded",
		"Drain the GPU and reset it; if errors return, replace it (check gpu.row-remap.* first).")
}

// counterCheck judges a counter against warn/fail limits ("above the limit").
func counterCheck(g *snapshot.GPU, v snapshot.Value[uint64], l Limits, what, since, remedy string) Result {
	if !v.OK() {
		return unknownFrom(v, what)
	}
	obs := fmt.Sprintf("%d %s", v.V, what)
	exp := limitText(l)
	x := float64(v.V)
	switch {
	case isSet(l.Fail) && x > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s has %d %s %s.", gpuName(g), v.V, what, since)}
	case isSet(l.Warn) && x > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s has %d %s %s.", gpuName(g), v.V, what, since)}
	}
	return pass(obs, exp, fmt.Sprintf("%d %s %s.", v.V, what, since))
}

// limitText is the expectation "≤ N" for the tightest set limit.
func limitText(l Limits) string {
	switch {
	case isSet(l.Warn) && (!isSet(l.Fail) || l.Warn < l.Fail):
		return "≤ " + fmtLimit(l.Warn)
	case isSet(l.Fail):
		return "≤ " + fmtLimit(l.Fail)
	}
	return ""
}

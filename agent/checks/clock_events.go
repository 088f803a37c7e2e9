package checks

import (
	"fmt"
	"strings"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// hwReasons are the clock event reasons that mean hardware is holding clocks down.
var hwReasons = []struct {
	bit  uint64
	name string
}{
	{snapshot.ClockEventHWSlowdown, "HW slowdown"},
	{snapshot.ClockEventHWThermalSlowdown, "HW thermal slowdown"},
	{snapshot.ClockEventHWPowerBrakeSlowdown, "HW power brake"},
}

// clockEvents: hardware slowdown reasons active now (HW slowdown 0x8, HW thermal 0x40,
// power brake 0x80), counted against Warn (0: any warns, as aznhc does) and Fail. SW
// thermal slowdown (0x20) warns too.
func clockEvents(_ *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.ClockEvents.OK() {
		return unknownFrom(g.ClockEvents, "clock event reasons")
	}
	var active []string
	for _, r := range hwReasons {
		if g.ClockEvents.V&r.bit != 0 {
			active = append(active, r.name)
		}
	}
	n := float64(len(active))
	obs := "none"
	if len(active) > 0 {
		obs = strings.Join(active, ", ")
	}
	const exp = "no HW slowdown or power brake"
	remedy := "Check the node's power supplies, cooling and BMC event log; HW slowdown and power brake come from the board."
	switch {
	case isSet(l.Fail) && n > l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s's clocks are held down by %s.", gpuName(g), obs)}
	case isSet(l.Warn) && n > l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp, Remedy: remedy,
			Message: fmt.Sprintf("%s's clocks are held down by %s.", gpuName(g), obs)}
	case g.ClockEvents.V&snapshot.ClockEventSWThermalSlowdown != 0:
		return Result{Status: Warn, Observed: "SW thermal slowdown", Expected: exp,
			Message: fmt.Sprintf("%s's driver slows its clocks for temperature.", gpuName(g)),
			Remedy:  "Check the node's cooling."}
	}
	return pass(obs, exp, "No hardware clock slowdown.")
}

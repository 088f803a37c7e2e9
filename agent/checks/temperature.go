package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// temperature: the margin below the GPU's own slowdown threshold, against Warn (5 °C)
// and Fail (0 °C: at the threshold the GPU slows down).
func temperature(_ *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.TemperatureC.OK() {
		return unknownFrom(g.TemperatureC, "temperature")
	}
	if !g.SlowdownC.OK() {
		return pass(fmt.Sprintf("%d °C", g.TemperatureC.V), "", "Temperature read; the GPU reports no slowdown threshold.")
	}
	margin := float64(g.SlowdownC.V - g.TemperatureC.V)
	obs := fmt.Sprintf("%d °C", g.TemperatureC.V)
	exp := fmt.Sprintf("< %d °C", g.SlowdownC.V)
	if isSet(l.Warn) {
		exp = fmt.Sprintf("≤ %g °C (%g below slowdown at %d °C)", float64(g.SlowdownC.V)-l.Warn-1, l.Warn, g.SlowdownC.V)
	}
	switch {
	case isSet(l.Fail) && margin <= l.Fail:
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s is at %d °C, at or past its slowdown threshold of %d °C.", gpuName(g), g.TemperatureC.V, g.SlowdownC.V),
			Remedy:  "Check the node's fans, airflow and inlet temperature; drain it until it cools."}
	case isSet(l.Warn) && margin <= l.Warn:
		return Result{Status: Warn, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s is at %d °C, %g °C below its slowdown threshold.", gpuName(g), g.TemperatureC.V, margin),
			Remedy:  "Check the node's fans, airflow and inlet temperature."}
	}
	return pass(obs, exp, "Temperature within limits.")
}

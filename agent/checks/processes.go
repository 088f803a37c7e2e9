package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// processes: at commissioning the GPU is idle: no compute process (Fail: 0 allowed,
// DCGM L1, gcm running_procs) and no memory in use beyond Warn MiB (15, gcm mem_usage).
// While workloads run (continuous phase) processes are expected and the check passes
// with what it saw.
func processes(in *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	if !g.Processes.OK() {
		return unknownFrom(g.Processes, "process list")
	}
	n := len(g.Processes.V)
	obs := fmt.Sprintf("%d processes", n)
	if g.MemoryUsedMiB.OK() {
		obs += fmt.Sprintf(", %d MiB used", g.MemoryUsedMiB.V)
	}
	if in.Phase == Continuous {
		return pass(obs, "", "Workloads may run; processes are not judged outside commissioning.")
	}
	exp := "no processes"
	if isSet(l.Fail) {
		exp = fmt.Sprintf("≤ %g processes", l.Fail)
	}
	if isSet(l.Fail) && float64(n) > l.Fail {
		pids := make([]int, n)
		for i, p := range g.Processes.V {
			pids[i] = int(p.PID)
		}
		return Result{Status: Fail, Observed: obs, Expected: exp,
			Message: fmt.Sprintf("%s runs processes %s during commissioning.", gpuName(g), joinInts(pids)),
			Remedy:  "Stop the stray processes (they hold GPU memory) and re-run the checks."}
	}
	if n == 0 && g.MemoryUsedMiB.OK() && isSet(l.Warn) && float64(g.MemoryUsedMiB.V) > l.Warn {
		return Result{Status: Warn, Observed: obs, Expected: fmt.Sprintf("≤ %g MiB used", l.Warn),
			Message: fmt.Sprintf("%s has %d MiB in use with no process.", gpuName(g), g.MemoryUsedMiB.V),
			Remedy:  "Reset the GPU to release leaked memory."}
	}
	return pass(obs, exp, "The GPU is idle.")
}

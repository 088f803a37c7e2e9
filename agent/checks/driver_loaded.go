package checks

import "github.com/gpurack/gpurack/agent/gpu/snapshot"

// driverLoaded: NVML initialised, so the kernel driver and libnvidia-ml are usable.
func driverLoaded(in *Input, _ *Check, _ Limits, _ *snapshot.GPU) Result {
	d := in.Snapshot.Driver
	if !d.Loaded {
		return Result{Status: Fail, Observed: d.Error, Expected: "NVML initialised",
			Message: "NVML is not available, so no GPU can be used or checked.",
			Remedy:  "Load the NVIDIA kernel driver (modprobe nvidia) or boot an image built for this node's GPU profile."}
	}
	return pass("NVML "+d.NVMLVersion, "NVML initialised", "NVML initialised.")
}

package checks

import (
	"fmt"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// driverVersion: the loaded driver is the profile's version (the image pins it).
func driverVersion(in *Input, _ *Check, _ Limits, _ *snapshot.GPU) Result {
	want, got := in.Profile.GPU.Driver.Version, in.Snapshot.Driver.Version
	if in.Profile.Simulated() {
		// A simulated GPU image pins no driver: it has none (gpu.simulator).
		return pass(got, "any (simulated GPU image: no driver)", "The simulator's driver; the image ships none.")
	}
	if got == want {
		return pass(got, want, "The driver is the profile's version.")
	}
	return Result{Status: Fail, Observed: got, Expected: want,
		Message: fmt.Sprintf("The node runs driver %q, the profile pins %s.", got, want),
		Remedy:  fmt.Sprintf("Boot the image built for profile %s (driver %s).", in.Profile.Name, want)}
}

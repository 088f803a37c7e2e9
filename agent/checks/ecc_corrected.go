package checks

import "github.com/gpurack/gpurack/agent/gpu/snapshot"

// eccCorrected: volatile corrected ECC errors, against Warn (10,000, aznhc) and Fail
// (50M, gcm).
func eccCorrected(_ *Input, _ *Check, l Limits, g *snapshot.GPU) Result {
	return counterCheck(g, g.ECCCorrected, l, "corrected ECC errors", "since the driver loaded",
		"Watch the rate; a GPU whose corrected errors keep climbing is failing: plan its replacement.")
}

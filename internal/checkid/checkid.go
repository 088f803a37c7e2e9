// Package checkid defines the check ids of CONTRACTS §9, once, for every part: the
// agent's checklist, gpuboot's rack report, metrics, alerts and profile overrides all
// name checks by these ids. New checks add ids; an id is never reused for another
// meaning.
package checkid

// ID names one check.
type ID string

// The check ids. The comment says what a result with that id is about.
const (
	DriverLoaded    ID = "gpu.driver.loaded"     // NVML initialises, so the kernel driver is loaded
	DriverVersion   ID = "gpu.driver.version"    // driver version equals the profile's
	Count           ID = "gpu.count"             // number of GPUs equals the profile's
	Product         ID = "gpu.product"           // product name equals the profile's
	Memory          ID = "gpu.memory"            // framebuffer size per GPU
	VBIOSConsistent ID = "gpu.vbios.consistent"  // all GPUs run the same VBIOS
	InfoROMValid    ID = "gpu.inforom.valid"     // InfoROM checksum valid and versions consistent
	PersistenceMode ID = "gpu.persistence-mode"  // persistence mode enabled
	ECCMode         ID = "gpu.ecc.mode"          // ECC enabled (current and pending)
	ECCUncorrected  ID = "gpu.ecc.uncorrected"   // volatile uncorrectable ECC errors
	ECCCorrected    ID = "gpu.ecc.corrected"     // corrected ECC errors against a threshold
	RowRemapPending ID = "gpu.row-remap.pending" // a row remap waits for a GPU reset
	RowRemapFailed  ID = "gpu.row-remap.failed"  // a row remap failed or uncorrectable rows exceed the limit
	RetiredPages    ID = "gpu.retired-pages"     // retired pages (pre-Ampere) against the limit
	PCIeLinkGen     ID = "gpu.pcie.link-gen"     // PCIe generation at the expected maximum
	PCIeLinkWidth   ID = "gpu.pcie.link-width"   // PCIe width at the expected maximum
	PCIeReplays     ID = "gpu.pcie.replays"      // PCIe replay counter rate
	NVLinkState     ID = "gpu.nvlink.state"      // every expected NVLink is up
	NVLinkErrors    ID = "gpu.nvlink.errors"     // NVLink CRC/replay/recovery error counters
	FabricState     ID = "gpu.fabric.state"      // NVSwitch fabric registration completed
	Temperature     ID = "gpu.temperature"       // temperature below the slowdown threshold
	ClockEvents     ID = "gpu.clock-events"      // no HW slowdown or power brake clock events
	Processes       ID = "gpu.processes"         // no stray processes or memory in use
	RecoveryAction  ID = "gpu.recovery-action"   // the driver asks for no reset or reboot
	XIDFatal        ID = "gpu.xid.fatal"         // no fatal XID since boot
	XIDRecent       ID = "gpu.xid.recent"        // no non-fatal, non-application XID recently
	RackPeerOutlier ID = "rack.peer-outlier"     // figures close to the rack's median
	Compute         ID = "gpu.compute"           // opt-in: kernels compute right, at the expected speed
)

// All lists every id in the order the checklist prints them.
var All = []ID{
	DriverLoaded, DriverVersion, Count, Product, Memory, VBIOSConsistent, InfoROMValid,
	PersistenceMode, ECCMode, ECCUncorrected, ECCCorrected, RowRemapPending, RowRemapFailed,
	RetiredPages, PCIeLinkGen, PCIeLinkWidth, PCIeReplays, NVLinkState, NVLinkErrors,
	FabricState, Temperature, ClockEvents, Processes, RecoveryAction, XIDFatal, XIDRecent,
	RackPeerOutlier, Compute,
}

var known = func() map[ID]bool {
	m := make(map[ID]bool, len(All))
	for _, id := range All {
		m[id] = true
	}
	return m
}()

// Known reports whether s is a defined check id.
func Known(s string) bool { return known[ID(s)] }

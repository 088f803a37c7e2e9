// Package snapshot holds what the agent read from its GPUs at one moment: plain data
// (Snapshot, GPU, Value) that the checks (agent/checks), health, metrics and reports
// use without touching NVML.
//
// It is a leaf: it imports neither go-nvml nor any other GPU library, so a package
// that needs only the data cannot reach NVML by accident (agent/checks has a test that
// holds it to this). Reading the GPUs is agent/gpu's job; NVML's numeric encodings the
// data keeps (clock event reasons) are mirrored here as constants, with a test that
// they equal go-nvml's.
package snapshot

import "time"

// Value is one reading from the backend, or why it could not be read.
type Value[T any] struct {
	V T
	// Err is empty when V is valid; otherwise NVML's answer ("ERROR_NOT_SUPPORTED",
	// "driver lacks nvmlDeviceGetGpuFabricInfoV", …).
	Err string
	// NotSupported is set when the GPU or driver does not offer the reading at all
	// (ERROR_NOT_SUPPORTED, or the symbol is missing); checks report not-applicable
	// rather than unknown.
	NotSupported bool
}

// OK reports whether V is valid.
func (v Value[T]) OK() bool { return v.Err == "" }

// Known returns a valid Value.
func Known[T any](v T) Value[T] { return Value[T]{V: v} }

// Snapshot is everything the agent read from its GPU backend at one moment.
type Snapshot struct {
	// Backend names the source: "nvml" or "sim:MODEL".
	Backend string
	// Simulated is true for the simulator.
	Simulated bool
	// TakenAt is when the read started.
	TakenAt time.Time
	// SlowTakenAt is when the slow-changing fields (identity, VBIOS, InfoROM, ECC
	// mode and aggregate counters, row remapping, retired pages, PCIe maximum link,
	// NVLink, fabric; agent/gpu.Tier lists them) were read: TakenAt after a full
	// read, earlier when a fast read carried them over from the snapshot before.
	SlowTakenAt time.Time
	Driver      Driver
	// Count is what DeviceGetCount answered; GPUs may hold fewer entries when a handle
	// could not be obtained.
	Count Value[int]
	GPUs  []GPU
}

// Driver is the node-level NVML state.
type Driver struct {
	// Loaded is true when NVML initialised.
	Loaded bool
	// Error says why NVML is not available ("NVML not available: …"); empty when
	// Loaded.
	Error string
	// Version is the kernel driver version, e.g. "535.261.03".
	Version string
	// NVMLVersion is the NVML library version, e.g. "12.535.261.03".
	NVMLVersion string
	// CUDADriverVersion is the CUDA version the driver supports, as NVML encodes it
	// (1000 × major + 10 × minor, e.g. 12020).
	CUDADriverVersion int
}

// GPU is one device's readings. Counters are as NVML reports them (since driver load
// for volatile counters, lifetime for aggregate ones).
type GPU struct {
	// Index is the NVML device index, 0-based, as nvidia-smi numbers GPUs.
	Index int
	// Lost is set when any call answered ERROR_GPU_IS_LOST: the GPU fell off the bus.
	// It counts as XID 79 (agent/xid).
	Lost bool

	UUID              string
	Name              Value[string]
	PCIBusID          string // "00000000:18:00.0", NVML's form
	Serial            string
	ComputeCapability string // "9.0"
	Architecture      string

	MemoryTotalMiB Value[uint64]
	MemoryUsedMiB  Value[uint64]

	VBIOS        Value[string]
	InfoROMImage Value[string]
	// InfoROMValid is the result of nvmlDeviceValidateInforom.
	InfoROMValid Value[bool]

	Persistence Value[bool]
	ECC         Value[ECCMode]
	// Volatile ECC counters (since the last driver load or GPU reset).
	ECCUncorrected Value[uint64]
	ECCCorrected   Value[uint64]
	// Aggregate (lifetime) ECC counters.
	ECCUncorrectedAggregate Value[uint64]
	ECCCorrectedAggregate   Value[uint64]

	RowRemap     Value[RowRemap]
	RetiredPages Value[RetiredPages]

	PCIe PCIe

	// NVLinks lists the links NVML enumerates (it stops at the first link index NVML
	// refuses). Empty on GPUs without NVLink.
	NVLinks Value[[]NVLink]
	Fabric  Value[Fabric]

	TemperatureC Value[int]
	// SlowdownC is the temperature at which the GPU starts HW slowdown.
	SlowdownC Value[int]
	// ClockEvents is the bitmask of nvmlClocksEventReasons currently active.
	ClockEvents Value[uint64]

	Processes Value[[]Process]
	// RecoveryAction is NVML's FI_DEV_GET_GPU_RECOVERY_ACTION field
	// (nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
	// 4 drain and reset).
	RecoveryAction Value[int]

	PowerMW        Value[uint32]
	UtilizationPct Value[uint32]
}

// ECCMode is the current and pending (after reset) ECC mode.
type ECCMode struct{ Current, Pending bool }

// RowRemap is nvmlDeviceGetRemappedRows.
type RowRemap struct {
	Corrected, Uncorrected int
	Pending, Failed        bool
}

// RetiredPages counts retired framebuffer pages by cause (pre-Ampere page
// retirement).
type RetiredPages struct {
	MultipleSBE, DBE int
	// Pending is true when retirement waits for a reboot or reset.
	Pending bool
}

// Total is the number of retired pages of both causes.
func (r RetiredPages) Total() int { return r.MultipleSBE + r.DBE }

// PCIe is the GPU's PCIe link.
type PCIe struct {
	CurGen, CurWidth Value[int]
	MaxGen, MaxWidth Value[int]
	// Replays is the PCIe replay counter (since driver load).
	Replays Value[uint64]
}

// NVLink is one link's state, DL error counters and, for an active link, what is at
// its other end.
type NVLink struct {
	Link                               int
	Active                             bool
	Replay, Recovery, CRCFlit, CRCData uint64
	// RemoteBusID is the PCI bus id of the device at the link's other end (another GPU,
	// or an NVSwitch), as NVML writes bus ids; empty when not read.
	RemoteBusID string
	// RemoteSwitch is set when that device is an NVSwitch: the GPUs of one NVSwitch
	// fabric form one NVLink domain.
	RemoteSwitch bool
}

// Errors is the sum of the link's error counters.
func (l NVLink) Errors() uint64 { return l.Replay + l.Recovery + l.CRCFlit + l.CRCData }

// Fabric is nvmlGpuFabricInfo: the GPU's registration with NVSwitch Fabric Manager.
type Fabric struct {
	// State is nvmlGpuFabricState_t: 0 not supported, 1 not started, 2 in progress,
	// 3 completed.
	State int
	// Status is the nvmlReturn_t of the registration; "SUCCESS" when it worked.
	Status string
	// DegradedBandwidth is set from the v2+ health mask.
	DegradedBandwidth bool
}

// Process is one compute process on a GPU.
type Process struct {
	PID     uint32
	UsedMiB uint64
}

// ByIndex returns the GPU with NVML index i, or nil.
func (s *Snapshot) ByIndex(i int) *GPU {
	for k := range s.GPUs {
		if s.GPUs[k].Index == i {
			return &s.GPUs[k]
		}
	}
	return nil
}

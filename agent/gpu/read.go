// Package gpu reads a node's GPUs into a Snapshot (agent/gpu/snapshot): plain data
// that the checks (agent/checks) evaluate without touching NVML.
//
// It declares what it needs from a GPU backend (Backend, Library) and reads through
// go-nvml's own interfaces, so the same adapter code runs against the real library
// (agent/gpu/nvml) and against go-nvml's mock servers (agent/gpu/sim). It is not a
// general NVML wrapper: it reads what the checks and metrics use, nothing else.
package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpurack/gpurack/agent/gpu/nvml"
)

// Backend is a source of NVML: the real library (agent/gpu/nvml) or the simulator
// (agent/gpu/sim).
type Backend interface {
	// Name is "nvml" or "sim:MODEL".
	Name() string
	// Simulated is true for the simulator.
	Simulated() bool
	// Library returns the initialised NVML interface, or an error that starts with
	// "NVML not available:" and says why. Callers must not call NVML in any other way:
	// with no library loaded, any call kills the process.
	Library() (nvml.Interface, error)
}

// Library is the part of NVML the adapter reads through.
type Library interface {
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetNVMLVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
	Extensions() nvml.ExtendedInterface
}

// FabricReader is implemented by devices that answer nvmlDeviceGetGpuFabricInfoV
// without cgo. go-nvml's GpuFabricInfoHandler calls the C library directly, so a mock
// device cannot stand in for it; the simulator's devices implement this instead.
type FabricReader interface {
	GpuFabricInfoV3() (nvml.GpuFabricInfo_v3, nvml.Return)
}

// Tier selects which fields a read refreshes.
type Tier int

const (
	// Full reads every field.
	Full Tier = iota
	// Fast reads what changes from one tick to the next and copies the slow fields
	// from the previous snapshot. Fast fields: the GPU count, temperature, clock
	// event reasons, utilization, power, memory used (and total, from the same
	// call), compute processes, the volatile ECC and PCIe replay counters (their
	// rates feed checks), the current PCIe link and the recovery-action field. Slow
	// fields: driver versions, identity (UUID, name, serial, bus id, compute
	// capability), VBIOS, InfoROM, persistence
	// and ECC mode, aggregate ECC counters, row remapping, retired pages, PCIe
	// maximum link, NVLink state and counters, fabric state and the slowdown
	// temperature. The slow ones change with a reset, a reboot, or a fault that the
	// driver also reports as an XID or NVML event, on which the monitor reads Full.
	Fast
)

func (t Tier) String() string {
	if t == Fast {
		return "fast"
	}
	return "full"
}

// Read reads every GPU of b once (a Full read). It never panics on a missing
// library: when b.Library fails, the snapshot says so in Driver.Error and has no
// GPUs.
func Read(b Backend) Snapshot { return NewReader(b).Read(Full, nil) }

// Reader reads one backend repeatedly, remembering which NVML symbols the loaded
// library exports. Its methods are safe for concurrent use.
type Reader struct {
	b Backend

	mu   sync.Mutex
	syms map[string]bool
}

// NewReader returns a Reader of b.
func NewReader(b Backend) *Reader { return &Reader{b: b} }

// Read reads the backend. With Fast and a previous snapshot of the same GPUs
// (prev non-nil, its driver loaded, the same GPU count), it refreshes only the fast
// fields (see Tier) and copies the rest, and SlowTakenAt stays prev's; any GPU prev
// lacks, or had lost, is read in full. Otherwise it reads everything. The returned
// snapshot may share the slow fields' slices with prev; snapshots are read-only.
func (rd *Reader) Read(tier Tier, prev *Snapshot) Snapshot {
	s := Snapshot{Backend: rd.b.Name(), Simulated: rd.b.Simulated(), TakenAt: time.Now()}
	lib, err := rd.b.Library()
	if err != nil {
		s.Driver.Error = err.Error()
		s.Count = Value[int]{Err: err.Error()}
		s.SlowTakenAt = s.TakenAt
		rd.mu.Lock()
		rd.syms = nil // a library that comes back may export other symbols
		rd.mu.Unlock()
		return s
	}
	r := reader{lib: lib, real: !s.Simulated, rd: rd}
	if tier == Fast && prev != nil && prev.Driver.Loaded && prev.Count.OK() {
		r.readFast(&s, prev)
		return s
	}
	r.read(&s)
	return s
}

// ReadLibrary fills s from an initialised library (a Full read).
func ReadLibrary(s *Snapshot, lib Library) {
	r := reader{lib: lib, real: !s.Simulated, rd: &Reader{}}
	r.read(s)
}

func (r *reader) read(s *Snapshot) {
	lib := r.lib
	s.SlowTakenAt = s.TakenAt
	s.Driver.Loaded = true
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		s.Driver.Version = v
	} else {
		s.Driver.Error = "nvmlSystemGetDriverVersion: " + ret.Error()
	}
	if v, ret := lib.SystemGetNVMLVersion(); ret == nvml.SUCCESS {
		s.Driver.NVMLVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		s.Driver.CUDADriverVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		s.Count = Value[int]{Err: "nvmlDeviceGetCount: " + ret.Error()}
		return
	}
	s.Count = Known(n)
	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.GPUs = append(s.GPUs, noHandle(i, ret))
			continue
		}
		s.GPUs = append(s.GPUs, r.device(i, dev))
	}
}

// readFast is a Fast read: the count, then per GPU the fast fields over a copy of
// prev's GPU. A changed count means GPUs came or went and indexes may now name other
// GPUs, so it reads everything.
func (r *reader) readFast(s *Snapshot, prev *Snapshot) {
	n, ret := r.lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n != prev.Count.V {
		r.read(s)
		return
	}
	s.Driver, s.Count, s.SlowTakenAt = prev.Driver, Known(n), prev.SlowTakenAt
	for i := 0; i < n; i++ {
		dev, ret := r.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.GPUs = append(s.GPUs, noHandle(i, ret))
			continue
		}
		old := prev.ByIndex(i)
		if old == nil || old.Lost || old.UUID == "" {
			s.GPUs = append(s.GPUs, r.device(i, dev))
			continue
		}
		g := *old
		g.Lost = false
		r.fast(&g, dev)
		s.GPUs = append(s.GPUs, g)
	}
}

func noHandle(i int, ret nvml.Return) GPU {
	g := GPU{Index: i, Lost: ret == nvml.ERROR_GPU_IS_LOST}
	g.Name = Value[string]{Err: "nvmlDeviceGetHandleByIndex: " + ret.Error()}
	return g
}

// reader is one read: the library it reads and the Reader whose symbol cache it
// uses.
type reader struct {
	lib  Library
	real bool
	rd   *Reader
}

// has reports whether the loaded library exports sym. go-nvml resolves symbols lazily,
// so calling a function the driver lacks kills the process; probe first, as go-nvlib
// does. Answers are kept for the Reader's life (until the library goes away).
func (r *reader) has(sym string) bool {
	rd := r.rd
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if ok, seen := rd.syms[sym]; seen {
		return ok
	}
	if rd.syms == nil {
		rd.syms = map[string]bool{}
	}
	ok := r.lib.Extensions().LookupSymbol(sym) == nil
	rd.syms[sym] = ok
	return ok
}

// value turns an NVML answer into a Value and marks the GPU lost on
// ERROR_GPU_IS_LOST.
func value[T any](g *GPU, v T, ret nvml.Return) Value[T] {
	switch ret {
	case nvml.SUCCESS:
		return Value[T]{V: v}
	case nvml.ERROR_NOT_SUPPORTED:
		return Value[T]{Err: ret.Error(), NotSupported: true}
	case nvml.ERROR_GPU_IS_LOST:
		g.Lost = true
	}
	return Value[T]{Err: ret.Error()}
}

func missing[T any](sym string) Value[T] {
	return Value[T]{Err: "driver lacks " + sym, NotSupported: true}
}

// call probes sym and, when present, calls f.
func call[T any](r *reader, g *GPU, sym string, f func() (T, nvml.Return)) Value[T] {
	if !r.has(sym) {
		return missing[T](sym)
	}
	v, ret := f()
	return value(g, v, ret)
}

// device is a Full read of one GPU: the slow fields, then the fast ones.
func (r *reader) device(i int, d nvml.Device) GPU {
	g := GPU{Index: i}
	r.slow(&g, d)
	r.fast(&g, d)
	return g
}

// slow reads the fields a Fast read copies from the previous snapshot (see Tier).
func (r *reader) slow(g *GPU, d nvml.Device) {
	if v := call(r, g, "nvmlDeviceGetUUID", d.GetUUID); v.OK() {
		g.UUID = v.V
	}
	g.Name = call(r, g, "nvmlDeviceGetName", d.GetName)
	if v := call(r, g, "nvmlDeviceGetPciInfo", d.GetPciInfo); v.OK() {
		g.PCIBusID = gpunvml.BusID(v.V)
	}
	if v := call(r, g, "nvmlDeviceGetSerial", d.GetSerial); v.OK() {
		g.Serial = v.V
	}
	if r.has("nvmlDeviceGetCudaComputeCapability") {
		if maj, minor, ret := d.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			g.ComputeCapability = fmt.Sprintf("%d.%d", maj, minor)
		}
	}

	g.VBIOS = call(r, g, "nvmlDeviceGetVbiosVersion", d.GetVbiosVersion)
	g.InfoROMImage = call(r, g, "nvmlDeviceGetInforomImageVersion", d.GetInforomImageVersion)
	if r.has("nvmlDeviceValidateInforom") {
		switch ret := d.ValidateInforom(); ret {
		case nvml.SUCCESS:
			g.InfoROMValid = Known(true)
		case nvml.ERROR_CORRUPTED_INFOROM:
			g.InfoROMValid = Known(false)
		default:
			g.InfoROMValid = value(g, false, ret)
		}
	} else {
		g.InfoROMValid = missing[bool]("nvmlDeviceValidateInforom")
	}

	g.Persistence = enabled(call(r, g, "nvmlDeviceGetPersistenceMode", d.GetPersistenceMode))
	if r.has("nvmlDeviceGetEccMode") {
		cur, pend, ret := d.GetEccMode()
		g.ECC = value(g, ECCMode{Current: cur == nvml.FEATURE_ENABLED, Pending: pend == nvml.FEATURE_ENABLED}, ret)
	} else {
		g.ECC = missing[ECCMode]("nvmlDeviceGetEccMode")
	}
	g.ECCUncorrectedAggregate = r.ecc(g, d, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
	g.ECCCorrectedAggregate = r.ecc(g, d, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC)

	if r.has("nvmlDeviceGetRemappedRows") {
		c, u, p, f, ret := d.GetRemappedRows()
		g.RowRemap = value(g, RowRemap{Corrected: c, Uncorrected: u, Pending: p, Failed: f}, ret)
	} else {
		g.RowRemap = missing[RowRemap]("nvmlDeviceGetRemappedRows")
	}
	g.RetiredPages = r.retiredPages(g, d)

	g.PCIe.MaxGen = call(r, g, "nvmlDeviceGetMaxPcieLinkGeneration", d.GetMaxPcieLinkGeneration)
	g.PCIe.MaxWidth = call(r, g, "nvmlDeviceGetMaxPcieLinkWidth", d.GetMaxPcieLinkWidth)

	g.NVLinks = r.nvlinks(g, d)
	g.Fabric = r.fabric(g, d)

	th := call(r, g, "nvmlDeviceGetTemperatureThreshold", func() (uint32, nvml.Return) {
		return d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
	})
	g.SlowdownC = Value[int]{V: int(th.V), Err: th.Err, NotSupported: th.NotSupported}
}

// fast reads the fields every tick refreshes (see Tier).
func (r *reader) fast(g *GPU, d nvml.Device) {
	mem := call(r, g, "nvmlDeviceGetMemoryInfo", d.GetMemoryInfo)
	g.MemoryTotalMiB = Value[uint64]{V: mem.V.Total >> 20, Err: mem.Err, NotSupported: mem.NotSupported}
	g.MemoryUsedMiB = Value[uint64]{V: mem.V.Used >> 20, Err: mem.Err, NotSupported: mem.NotSupported}
	// The v1 "used" includes memory the driver reserves (hundreds of MiB on Hopper);
	// v2 reports it apart, and its "used" is what nvidia-smi shows and gcm's 15 MiB
	// threshold means.
	if r.has("nvmlDeviceGetMemoryInfo_v2") {
		if m2, ret := d.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
			g.MemoryUsedMiB = Known(m2.Used >> 20)
		}
	}

	// Volatile ECC counters (since the last driver load or GPU reset).
	g.ECCUncorrected = r.ecc(g, d, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	g.ECCCorrected = r.ecc(g, d, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)

	g.PCIe.CurGen = call(r, g, "nvmlDeviceGetCurrPcieLinkGeneration", d.GetCurrPcieLinkGeneration)
	g.PCIe.CurWidth = call(r, g, "nvmlDeviceGetCurrPcieLinkWidth", d.GetCurrPcieLinkWidth)
	rep := call(r, g, "nvmlDeviceGetPcieReplayCounter", d.GetPcieReplayCounter)
	g.PCIe.Replays = Value[uint64]{V: uint64(max(rep.V, 0)), Err: rep.Err, NotSupported: rep.NotSupported}

	t := call(r, g, "nvmlDeviceGetTemperature", func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) })
	g.TemperatureC = Value[int]{V: int(t.V), Err: t.Err, NotSupported: t.NotSupported}
	// nvmlDeviceGetCurrentClocksEventReasons replaced ...ClocksThrottleReasons in 535;
	// older drivers only have the latter.
	if r.has("nvmlDeviceGetCurrentClocksEventReasons") {
		v, ret := d.GetCurrentClocksEventReasons()
		g.ClockEvents = value(g, v, ret)
	} else {
		g.ClockEvents = call(r, g, "nvmlDeviceGetCurrentClocksThrottleReasons", d.GetCurrentClocksThrottleReasons)
	}

	g.Processes = r.processes(g, d)
	g.RecoveryAction = r.recoveryAction(g, d)
	g.PowerMW = call(r, g, "nvmlDeviceGetPowerUsage", d.GetPowerUsage)
	u := call(r, g, "nvmlDeviceGetUtilizationRates", d.GetUtilizationRates)
	g.UtilizationPct = Value[uint32]{V: u.V.Gpu, Err: u.Err, NotSupported: u.NotSupported}
}

func (r *reader) ecc(g *GPU, d nvml.Device, t nvml.MemoryErrorType, c nvml.EccCounterType) Value[uint64] {
	return call(r, g, "nvmlDeviceGetTotalEccErrors", func() (uint64, nvml.Return) { return d.GetTotalEccErrors(t, c) })
}

func enabled(v Value[nvml.EnableState]) Value[bool] {
	return Value[bool]{V: v.V == nvml.FEATURE_ENABLED, Err: v.Err, NotSupported: v.NotSupported}
}

func (r *reader) retiredPages(g *GPU, d nvml.Device) Value[RetiredPages] {
	const sym = "nvmlDeviceGetRetiredPages"
	if !r.has(sym) {
		return missing[RetiredPages](sym)
	}
	sbe, ret := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
	if ret != nvml.SUCCESS {
		return value(g, RetiredPages{}, ret)
	}
	dbe, ret := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
	if ret != nvml.SUCCESS {
		return value(g, RetiredPages{}, ret)
	}
	rp := RetiredPages{MultipleSBE: len(sbe), DBE: len(dbe)}
	if r.has("nvmlDeviceGetRetiredPagesPendingStatus") {
		if p, ret := d.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS {
			rp.Pending = p == nvml.FEATURE_ENABLED
		}
	}
	return Known(rp)
}

// nvlinks enumerates links up to NVLINK_MAX_LINKS and stops at the first link index
// NVML refuses, as aznhc and gpud do.
func (r *reader) nvlinks(g *GPU, d nvml.Device) Value[[]NVLink] {
	const sym = "nvmlDeviceGetNvLinkState"
	if !r.has(sym) {
		return missing[[]NVLink](sym)
	}
	counters := r.has("nvmlDeviceGetNvLinkErrorCounter")
	remote, remoteType := r.has("nvmlDeviceGetNvLinkRemotePciInfo_v2"), r.has("nvmlDeviceGetNvLinkRemoteDeviceType")
	var links []NVLink
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, ret := d.GetNvLinkState(l)
		if ret == nvml.ERROR_GPU_IS_LOST {
			return value[[]NVLink](g, nil, ret)
		}
		if ret != nvml.SUCCESS {
			if l == 0 && ret == nvml.ERROR_NOT_SUPPORTED {
				return value[[]NVLink](g, nil, ret)
			}
			break
		}
		link := NVLink{Link: l, Active: st == nvml.FEATURE_ENABLED}
		if counters {
			get := func(c nvml.NvLinkErrorCounter) uint64 {
				v, ret := d.GetNvLinkErrorCounter(l, c)
				if ret != nvml.SUCCESS {
					return 0
				}
				return v
			}
			link.Replay = get(nvml.NVLINK_ERROR_DL_REPLAY)
			link.Recovery = get(nvml.NVLINK_ERROR_DL_RECOVERY)
			link.CRCFlit = get(nvml.NVLINK_ERROR_DL_CRC_FLIT)
			link.CRCData = get(nvml.NVLINK_ERROR_DL_CRC_DATA)
		}
		// What the link reaches, for the device plugin's NVLink domains; a refusal
		// leaves it unknown.
		if link.Active && remote {
			if p, ret := d.GetNvLinkRemotePciInfo(l); ret == nvml.SUCCESS {
				link.RemoteBusID = gpunvml.BusID(p)
			}
		}
		if link.Active && remoteType {
			if t, ret := d.GetNvLinkRemoteDeviceType(l); ret == nvml.SUCCESS {
				link.RemoteSwitch = t == nvml.NVLINK_DEVICE_TYPE_SWITCH
			}
		}
		links = append(links, link)
	}
	return Known(links)
}

func (r *reader) fabric(g *GPU, d nvml.Device) Value[Fabric] {
	var (
		info nvml.GpuFabricInfo_v3
		ret  nvml.Return
	)
	switch fr, ok := d.(FabricReader); {
	case ok:
		info, ret = fr.GpuFabricInfoV3()
	case r.real && r.has("nvmlDeviceGetGpuFabricInfoV"):
		info, ret = d.GetGpuFabricInfoV().V3()
	case r.real && r.has("nvmlDeviceGetGpuFabricInfo"):
		var v1 nvml.GpuFabricInfo
		v1, ret = d.GetGpuFabricInfo()
		info = nvml.GpuFabricInfo_v3{State: v1.State, Status: v1.Status}
	default:
		return missing[Fabric]("nvmlDeviceGetGpuFabricInfoV")
	}
	if ret != nvml.SUCCESS {
		return value(g, Fabric{}, ret)
	}
	if info.State == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		return Value[Fabric]{Err: "fabric not supported (no NVSwitch)", NotSupported: true}
	}
	f := Fabric{State: int(info.State), Status: nvml.Return(info.Status).Error()}
	f.DegradedBandwidth = info.HealthMask&0x3 == nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
	return Known(f)
}

func (r *reader) processes(g *GPU, d nvml.Device) Value[[]Process] {
	v := call(r, g, "nvmlDeviceGetComputeRunningProcesses", d.GetComputeRunningProcesses)
	if !v.OK() {
		return Value[[]Process]{Err: v.Err, NotSupported: v.NotSupported}
	}
	ps := make([]Process, 0, len(v.V))
	for _, p := range v.V {
		ps = append(ps, Process{PID: p.Pid, UsedMiB: p.UsedGpuMemory >> 20})
	}
	return Known(ps)
}

// recoveryAction reads FI_DEV_GET_GPU_RECOVERY_ACTION. Drivers before the field
// existed answer its per-field return with an error; that is not-supported.
func (r *reader) recoveryAction(g *GPU, d nvml.Device) Value[int] {
	const sym = "nvmlDeviceGetFieldValues"
	if !r.has(sym) {
		return missing[int](sym)
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := d.GetFieldValues(fv); ret != nvml.SUCCESS {
		return value(g, 0, ret)
	}
	if ret := nvml.Return(fv[0].NvmlReturn); ret != nvml.SUCCESS {
		v := value(g, 0, ret)
		v.NotSupported = v.NotSupported || ret == nvml.ERROR_INVALID_ARGUMENT
		return v
	}
	return Known(int(fieldUint(fv[0])))
}

// fieldUint decodes a field value's 8 bytes (a C union, little-endian on the
// platforms NVML supports).
func fieldUint(f nvml.FieldValue) uint64 {
	b := f.Value[:]
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(b))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(b))
	case nvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.LittleEndian.Uint64(b)))
	default:
		return binary.LittleEndian.Uint64(b)
	}
}

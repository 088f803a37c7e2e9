// Package sim is the GPU backend for machines without GPUs: go-nvml's own mock servers
// (pkg/nvml/mock: dgxa100, dgxh100, dgxh200) with every health-related method filled
// with a healthy reading, and faults injected on top (ParseFault, Sim.Inject).
//
// It stands in for NVML only; the rest of the agent (snapshot adapter, checks, XID
// watch) runs unchanged against it, so a test against the simulator exercises the same
// code as a node with real GPUs. It is not a performance model: readings are constant
// apart from injected faults.
package sim

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// model is what the mock servers do not say about a node's GPUs.
type model struct {
	new                  func() *server.Server
	pcieGen, pcieWidth   int
	nvlinks              int
	vbios, inforom       string
	slowdownC, idleTempC int
	idlePowerMW          uint32
	fabric               bool // NVSwitch fabric info supported (Hopper and later)
	// nvlinkPairs: the links join GPUs 2k and 2k+1 (PCIe cards with NVLink bridges)
	// instead of reaching NVSwitches, so the node has one NVLink domain per pair.
	nvlinkPairs bool
	// product replaces the mock's product name when set.
	product string
}

// Models lists the simulated node models by name.
var models = map[string]model{
	"dgxa100": {new: dgxa100.New, pcieGen: 4, pcieWidth: 16, nvlinks: 12, vbios: "92.00.45.00.06", inforom: "G506.0201.00.06", slowdownC: 90, idleTempC: 32, idlePowerMW: 56000},
	"dgxh100": {new: dgxh100.New, pcieGen: 5, pcieWidth: 16, nvlinks: 18, vbios: "96.00.89.00.01", inforom: "G520.0200.00.05", slowdownC: 87, idleTempC: 34, idlePowerMW: 71000, fabric: true},
	// 8 H100 NVL PCIe cards, NVLink-bridged in pairs (no NVSwitch): four NVLink
	// domains of two GPUs. The mock's H100 SXM readings stand in for the NVL card's.
	"h100nvl": {new: dgxh100.New, pcieGen: 5, pcieWidth: 16, nvlinks: 18, vbios: "96.00.74.00.1A", inforom: "G550.0210.00.01", slowdownC: 87, idleTempC: 31, idlePowerMW: 60000,
		nvlinkPairs: true, product: "NVIDIA H100 NVL"},
	"dgxh200": {new: dgxh200.New, pcieGen: 5, pcieWidth: 16, nvlinks: 18, vbios: "96.00.9F.00.01", inforom: "G525.0200.00.05", slowdownC: 87, idleTempC: 33, idlePowerMW: 76000, fabric: true},
}

// Models returns the model names, sorted.
func Models() []string {
	names := make([]string, 0, len(models))
	for n := range models {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PCI bus numbers of a DGX H100's eight GPUs, used for every model so that bus ids look
// like a real node's.
var busNumbers = []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

// Options configure a simulator.
type Options struct {
	// DriverVersion is what NVML reports; the profile's version, so a healthy simulated
	// node passes gpu.driver.version. Empty: the mock server's 550.54.15.
	DriverVersion string
	// Seed makes GPU UUIDs and serials stable and distinct per simulated node (use the
	// node name). Empty: "gpurack-sim".
	Seed string
	// Now is the clock for fault expiry; nil means time.Now.
	Now func() time.Time
}

// ActiveFault is an injected fault still in effect.
type ActiveFault struct {
	ID         string
	Fault      Fault
	InjectedAt time.Time
	// ExpiresAt is zero when the fault lasts until Clear.
	ExpiresAt time.Time
}

// Sim is a simulated node. It is safe for concurrent use.
type Sim struct {
	name  string
	model model
	srv   *server.Server
	devs  []*Device
	now   func() time.Time
	drv   string

	mu     sync.Mutex
	faults []ActiveFault
	nextID int
	sets   []*eventSet
}

// Device is one simulated GPU: go-nvml's mock device with the simulator's readings.
type Device struct {
	*server.Device
	sim  *Sim
	phys int // position in the node, before gpu-missing faults renumber
}

// New builds a simulated node of the named model ("dgxa100", "dgxh100", "dgxh200").
func New(name string, o Options) (*Sim, error) {
	m, ok := models[name]
	if !ok {
		return nil, fmt.Errorf("unknown simulator model %q; models: %s", name, strings.Join(Models(), ", "))
	}
	s := &Sim{name: name, model: m, srv: m.new(), now: o.Now}
	if s.now == nil {
		s.now = time.Now
	}
	s.drv = o.DriverVersion
	if s.drv == "" {
		s.drv = s.srv.DriverVersion
	}
	seed := o.Seed
	if seed == "" {
		seed = "gpurack-sim"
	}
	for i, d := range s.srv.Devices {
		sd := d.(*server.Device)
		sum := sha256.Sum256([]byte(seed + "/" + strconv.Itoa(i)))
		sd.UUID = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		bus := busNumbers[i%len(busNumbers)]
		sd.PciBusID = fmt.Sprintf("00000000:%02x:00.0", bus)
		dev := &Device{Device: sd, sim: s, phys: i}
		dev.setFuncs(fmt.Sprintf("16542%08d", int(sum[16])<<16|int(sum[17])<<8|int(sum[18])))
		s.devs = append(s.devs, dev)
	}
	s.setServerFuncs()
	return s, nil
}

// Name is "sim:MODEL".
func (s *Sim) Name() string { return "sim:" + s.name }

// Simulated is true.
func (s *Sim) Simulated() bool { return true }

// Library returns the mock server, or the simulated Init failure while a
// driver-unloaded fault is active.
func (s *Sim) Library() (nvml.Interface, error) {
	if s.hasNodeFault(KindDriverUnloaded) {
		return nil, fmt.Errorf("NVML not available: ERROR_DRIVER_NOT_LOADED (simulated driver-unloaded fault)")
	}
	return s.srv, nil
}

// Close does nothing; it exists so the simulator closes like the NVML backend.
func (s *Sim) Close() error { return nil }

// GPUCount is the number of GPUs the model has, before gpu-missing faults.
func (s *Sim) GPUCount() int { return len(s.devs) }

// Inject applies f until Clear, or until d has passed when d > 0. XID faults happen
// once and are not kept. It returns the fault's id.
func (s *Sim) Inject(f Fault, d time.Duration) (string, error) {
	if f.Kind <= KindUnspecified || f.Kind >= kindCount {
		return "", fmt.Errorf("fault: unknown kind %d", int(f.Kind))
	}
	if !f.Kind.NodeLevel() && (f.GPU < 0 || f.GPU >= len(s.devs)) {
		return "", fmt.Errorf("fault %s: the simulated %s has GPUs gpu0..gpu%d", f, s.name, len(s.devs)-1)
	}
	if err := f.checkValue(); err != nil {
		return "", fmt.Errorf("fault %s: %v", f, err)
	}
	s.mu.Lock()
	s.nextID++
	id := "f-" + strconv.Itoa(s.nextID)
	now := s.now()
	af := ActiveFault{ID: id, Fault: f, InjectedAt: now}
	if d > 0 {
		af.ExpiresAt = now.Add(d)
	}
	if f.Kind != KindXID {
		s.faults = append(s.faults, af)
	}
	s.mu.Unlock()

	switch f.Kind {
	case KindXID:
		s.emit(f.GPU, nvml.EventTypeXidCriticalError, uint64(f.Value))
	case KindGPULost:
		s.emit(f.GPU, nvml.EventTypeXidCriticalError, 79)
	case KindECCUncorrected:
		s.emit(f.GPU, nvml.EventTypeDoubleBitEccError, 0)
	}
	return id, nil
}

// Clear removes the named faults, or all when ids is empty, and returns how many it
// removed.
func (s *Sim) Clear(ids ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.faults)
	if len(ids) == 0 {
		s.faults = nil
		return n
	}
	s.faults = slices.DeleteFunc(s.faults, func(a ActiveFault) bool { return slices.Contains(ids, a.ID) })
	return n - len(s.faults)
}

// Active lists the faults in effect, oldest first.
func (s *Sim) Active() []ActiveFault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	return slices.Clone(s.faults)
}

func (s *Sim) expireLocked() {
	now := s.now()
	s.faults = slices.DeleteFunc(s.faults, func(a ActiveFault) bool {
		return !a.ExpiresAt.IsZero() && !now.Before(a.ExpiresAt)
	})
}

func (s *Sim) hasNodeFault(k Kind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	for _, a := range s.faults {
		if a.Fault.Kind == k {
			return true
		}
	}
	return false
}

// visible returns the physical indexes NVML enumerates (gpu-missing faults removed).
func (s *Sim) visible() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	var out []int
	for i := range s.devs {
		missing := false
		for _, a := range s.faults {
			if a.Fault.Kind == KindGPUMissing && a.Fault.GPU == i {
				missing = true
			}
		}
		if !missing {
			out = append(out, i)
		}
	}
	return out
}

// reading is one GPU's effective state: healthy values plus active faults.
type reading struct {
	lost                      bool
	eccUnc, eccCorr           uint64
	remapPending, remapFailed bool
	remapUnc                  int
	retired                   int
	pcieGen, pcieWidth        int
	replays                   uint64
	nvlinkDown                int
	nvlinkErrors              uint64
	tempC                     int
	fabricUnhealthy           bool
	clockEvents               uint64
	procs                     []nvml.ProcessInfo
	usedMiB                   uint64
	recovery                  int
}

func (s *Sim) read(phys int) reading {
	m := s.model
	r := reading{pcieGen: m.pcieGen, pcieWidth: m.pcieWidth, tempC: m.idleTempC}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	for _, a := range s.faults {
		f := a.Fault
		if f.GPU != phys {
			continue
		}
		v := f.Value
		switch f.Kind {
		case KindGPULost:
			r.lost = true
		case KindECCUncorrected:
			r.eccUnc += uint64(v)
		case KindECCCorrected:
			r.eccCorr += uint64(v)
		case KindRowRemapPending:
			r.remapPending = true
		case KindRowRemapFailed:
			r.remapFailed = true
		case KindRowRemapUncorrectable:
			r.remapUnc += int(v)
		case KindRetiredPages:
			r.retired += int(v)
		case KindPCIeGen:
			r.pcieGen = int(v)
		case KindPCIeWidth:
			r.pcieWidth = int(v)
		case KindPCIeReplays:
			r.replays += uint64(v)
		case KindNVLinkDown:
			r.nvlinkDown += int(v)
		case KindNVLinkErrors:
			r.nvlinkErrors += uint64(v)
		case KindTemperature:
			r.tempC = int(v)
		case KindFabricUnhealthy:
			r.fabricUnhealthy = true
		case KindHWSlowdown:
			r.clockEvents |= nvml.ClocksThrottleReasonHwSlowdown
		case KindThermalSlowdown:
			r.clockEvents |= nvml.ClocksThrottleReasonHwThermalSlowdown
		case KindPowerBrake:
			r.clockEvents |= nvml.ClocksThrottleReasonHwPowerBrakeSlowdown
		case KindStrayProcess:
			pid := uint32(4000 + len(r.procs))
			r.procs = append(r.procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: uint64(v) << 20, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
			r.usedMiB += uint64(v)
		case KindRecoveryAction:
			r.recovery = int(v)
		}
	}
	return r
}

func (s *Sim) setServerFuncs() {
	srv := s.srv
	srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) {
		if s.hasNodeFault(KindDriverMismatch) {
			return mismatched(s.drv), nvml.SUCCESS
		}
		return s.drv, nvml.SUCCESS
	}
	srv.SystemGetNVMLVersionFunc = func() (string, nvml.Return) {
		if s.hasNodeFault(KindDriverMismatch) {
			return "12." + mismatched(s.drv), nvml.SUCCESS
		}
		return "12." + s.drv, nvml.SUCCESS
	}
	srv.DeviceGetCountFunc = func() (int, nvml.Return) { return len(s.visible()), nvml.SUCCESS }
	srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		vis := s.visible()
		if i < 0 || i >= len(vis) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return s.devs[vis[i]], nvml.SUCCESS
	}
	srv.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		for _, i := range s.visible() {
			if s.devs[i].UUID == uuid {
				return s.devs[i], nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	srv.DeviceGetHandleByPciBusIdFunc = func(bus string) (nvml.Device, nvml.Return) {
		for _, i := range s.visible() {
			if strings.EqualFold(s.devs[i].PciBusID, bus) {
				return s.devs[i], nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return s.newEventSet(), nvml.SUCCESS }
	srv.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
}

// mismatched returns a driver version other than v.
func mismatched(v string) string {
	if v == "535.183.01" {
		return "550.54.15"
	}
	return "535.183.01"
}

// index returns the device's current NVML index, or -1 while it is missing.
func (d *Device) index() int {
	for i, p := range d.sim.visible() {
		if p == d.phys {
			return i
		}
	}
	return -1
}

func lostOr[T any](r reading, v T) (T, nvml.Return) {
	if r.lost {
		var zero T
		return zero, nvml.ERROR_GPU_IS_LOST
	}
	return v, nvml.SUCCESS
}

// setFuncs answers each NVML device call the agent makes from the simulator's state;
// a lost GPU answers ERROR_GPU_IS_LOST.
func (d *Device) setFuncs(serial string) {
	d.setIdentityFuncs(serial)
	d.setMemoryFuncs()
	d.setLinkFuncs()
	d.setSensorFuncs()
}

// reading is the device's current state.
func (d *Device) reading() reading { return d.sim.read(d.phys) }

// pciInfo is a PciInfo naming bus, as NVML writes it (NUL-terminated).
func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(bus) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

// setIdentityFuncs answers for the index, names, PCI identity, VBIOS, InfoROM and
// persistence mode.
func (d *Device) setIdentityFuncs(serial string) {
	m := d.sim.model
	rd := d.reading
	d.GetIndexFunc = func() (int, nvml.Return) { return lostOr(rd(), d.index()) }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return lostOr(rd(), d.phys) }
	d.GetUUIDFunc = func() (string, nvml.Return) { return lostOr(rd(), d.UUID) }
	d.GetNameFunc = func() (string, nvml.Return) { return lostOr(rd(), cmp.Or(m.product, d.Config.Name)) }
	d.GetSerialFunc = func() (string, nvml.Return) { return lostOr(rd(), serial) }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := pciInfo(d.PciBusID)
		p.PciDeviceId = d.Config.PciDeviceId
		return lostOr(rd(), p)
	}
	d.GetVbiosVersionFunc = func() (string, nvml.Return) { return lostOr(rd(), m.vbios) }
	d.ValidateInforomFunc = func() nvml.Return { _, ret := lostOr(rd(), 0); return ret }
	d.GetInforomImageVersionFunc = func() (string, nvml.Return) { return lostOr(rd(), m.inforom) }
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return lostOr(rd(), nvml.FEATURE_ENABLED) }
}

// setMemoryFuncs answers for memory use, ECC counters, remapped rows and retired pages.
func (d *Device) setMemoryFuncs() {
	rd := d.reading
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		r := rd()
		total := d.MemoryInfo.Total
		used := min(r.usedMiB<<20, total)
		return lostOr(r, nvml.Memory{Total: total, Used: used, Free: total - used})
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		r := rd()
		total := d.MemoryInfo.Total
		used := min(r.usedMiB<<20, total)
		return lostOr(r, nvml.Memory_v2{Total: total, Used: used, Free: total - used})
	}
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		r := rd()
		if r.lost {
			return 0, 0, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		r := rd()
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return lostOr(r, r.eccUnc)
		}
		return lostOr(r, r.eccCorr)
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		r := rd()
		if r.lost {
			return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST
		}
		return 0, r.remapUnc, r.remapPending, r.remapFailed, nvml.SUCCESS
	}
	d.GetRetiredPagesFunc = func(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
		r := rd()
		if c != nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR {
			return lostOr[[]uint64](r, nil)
		}
		pages := make([]uint64, r.retired)
		for i := range pages {
			pages[i] = 0x1000 + uint64(i)
		}
		return lostOr(r, pages)
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return lostOr(rd(), nvml.FEATURE_DISABLED) }
}

// setLinkFuncs answers for the PCIe link and the NVLinks.
func (d *Device) setLinkFuncs() {
	s, m := d.sim, d.sim.model
	rd := d.reading
	d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { r := rd(); return lostOr(r, r.pcieGen) }
	d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { r := rd(); return lostOr(r, r.pcieWidth) }
	d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return lostOr(rd(), m.pcieGen) }
	d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return lostOr(rd(), m.pcieWidth) }
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) { r := rd(); return lostOr(r, int(r.replays)) }
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		r := rd()
		if l < 0 || l >= m.nvlinks {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if l >= m.nvlinks-r.nvlinkDown {
			return lostOr(r, nvml.FEATURE_DISABLED)
		}
		return lostOr(r, nvml.FEATURE_ENABLED)
	}
	// Each link reaches the partner GPU (nvlinkPairs) or one of the baseboard's
	// NVSwitches (their bus ids stand apart from the GPUs').
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		r := rd()
		if l < 0 || l >= m.nvlinks {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		bus := fmt.Sprintf("00000000:%02x:00.0", 0xe0+l%4)
		if m.nvlinkPairs {
			bus = s.devs[d.phys^1].PciBusID
		}
		return lostOr(r, pciInfo(bus))
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		r := rd()
		if l < 0 || l >= m.nvlinks {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if m.nvlinkPairs {
			return lostOr(r, nvml.NVLINK_DEVICE_TYPE_GPU)
		}
		return lostOr(r, nvml.NVLINK_DEVICE_TYPE_SWITCH)
	}
	d.GetNvLinkErrorCounterFunc = func(l int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
		r := rd()
		if l < 0 || l >= m.nvlinks {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if l == 0 && c == nvml.NVLINK_ERROR_DL_CRC_FLIT {
			return lostOr(r, r.nvlinkErrors)
		}
		return lostOr(r, uint64(0))
	}
}

// setSensorFuncs answers for temperature, clocks, processes, field values, power and
// events.
func (d *Device) setSensorFuncs() {
	m := d.sim.model
	rd := d.reading
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { r := rd(); return lostOr(r, uint32(r.tempC)) }
	d.GetTemperatureThresholdFunc = func(t nvml.TemperatureThresholds) (uint32, nvml.Return) {
		switch t {
		case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
			return lostOr(rd(), uint32(m.slowdownC))
		case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
			return lostOr(rd(), uint32(m.slowdownC+5))
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	clocks := func() (uint64, nvml.Return) {
		r := rd()
		if r.clockEvents == 0 {
			return lostOr(r, uint64(nvml.ClocksEventReasonGpuIdle))
		}
		return lostOr(r, r.clockEvents)
	}
	d.GetCurrentClocksEventReasonsFunc = clocks
	d.GetCurrentClocksThrottleReasonsFunc = clocks
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { r := rd(); return lostOr(r, r.procs) }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return lostOr[[]nvml.ProcessInfo](rd(), nil) }
	d.GetFieldValuesFunc = func(fv []nvml.FieldValue) nvml.Return {
		r := rd()
		if r.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		for i := range fv {
			switch fv[i].FieldId {
			case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
				fv[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				fv[i].NvmlReturn = uint32(nvml.SUCCESS)
				fv[i].Value = [8]byte{byte(r.recovery)}
			default:
				fv[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return lostOr(rd(), m.idlePowerMW) }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return lostOr(rd(), nvml.Utilization{}) }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return lostOr(rd(), uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError|nvml.EventTypeSingleBitEccError))
	}
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		es, ok := set.(*eventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		es.register(d.phys, mask)
		return nvml.SUCCESS
	}
}

// GpuFabricInfoV3 answers for nvmlDeviceGetGpuFabricInfoV (see gpu.FabricReader).
func (d *Device) GpuFabricInfoV3() (nvml.GpuFabricInfo_v3, nvml.Return) {
	r := d.sim.read(d.phys)
	if !d.sim.model.fabric {
		return nvml.GpuFabricInfo_v3{}, nvml.ERROR_NOT_SUPPORTED
	}
	info := nvml.GpuFabricInfo_v3{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS), HealthMask: nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE}
	if r.fabricUnhealthy {
		info.State = nvml.GPU_FABRIC_STATE_IN_PROGRESS
		info.Status = uint32(nvml.ERROR_UNKNOWN)
	}
	return lostOr(r, info)
}

// eventSet is an NVML event set fed by injected faults.
type eventSet struct {
	mock.EventSet
	ch chan nvml.EventData

	mu   sync.Mutex
	mask map[int]uint64
}

func (s *Sim) newEventSet() *eventSet {
	es := &eventSet{ch: make(chan nvml.EventData, 256), mask: map[int]uint64{}}
	es.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case e := <-es.ch:
			return e, nvml.SUCCESS
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	es.FreeFunc = func() nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sets = slices.DeleteFunc(s.sets, func(x *eventSet) bool { return x == es })
		return nvml.SUCCESS
	}
	s.mu.Lock()
	s.sets = append(s.sets, es)
	s.mu.Unlock()
	return es
}

// wants reports whether the set registered for event type typ on GPU phys.
func (es *eventSet) wants(phys int, typ uint64) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.mask[phys]&typ != 0
}

func (es *eventSet) register(phys int, mask uint64) {
	es.mu.Lock()
	es.mask[phys] |= mask
	es.mu.Unlock()
}

// Watched reports whether an NVML event set has registered for event type typ on GPU
// phys: before that, an injected event of that type reaches no one, as with NVML.
func (s *Sim) Watched(phys int, typ uint64) bool {
	s.mu.Lock()
	sets := slices.Clone(s.sets)
	s.mu.Unlock()
	for _, es := range sets {
		if es.wants(phys, typ) {
			return true
		}
	}
	return false
}

// emit delivers an event to every event set that registered for it. A full set drops
// the event, as NVML's own bounded queue does.
func (s *Sim) emit(phys int, typ uint64, data uint64) {
	s.mu.Lock()
	sets := slices.Clone(s.sets)
	s.mu.Unlock()
	for _, es := range sets {
		if !es.wants(phys, typ) {
			continue
		}
		select {
		case es.ch <- nvml.EventData{Device: s.devs[phys], EventType: typ, EventData: data}:
		default:
		}
	}
}

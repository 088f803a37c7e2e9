package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is what an injected fault breaks. The text names are those of
// gpurack.agent.v1.FaultKind; the kinds after KindDriverUnloaded are simulator
// extensions that the API carries in FaultSpec.spec only (their FaultKind is
// UNSPECIFIED), see docs/agent.md.
type Kind int

// The fault kinds.
const (
	KindUnspecified Kind = iota
	KindXID
	KindECCUncorrected
	KindECCCorrected
	KindRowRemapPending
	KindRowRemapFailed
	KindRetiredPages
	KindPCIeGen
	KindPCIeWidth
	KindPCIeReplays
	KindNVLinkDown
	KindNVLinkErrors
	KindTemperature
	KindFabricUnhealthy
	KindGPULost
	KindDriverUnloaded
	// Simulator extensions (no FaultKind value in the API).
	KindGPUMissing
	KindDriverMismatch
	KindHWSlowdown
	KindThermalSlowdown
	KindPowerBrake
	KindStrayProcess
	KindRowRemapUncorrectable
	KindRecoveryAction
	kindCount
)

type kindInfo struct {
	name    string
	value   bool // takes a VALUE
	nodeLvl bool // no @gpuN
	help    string
}

var kinds = [kindCount]kindInfo{
	KindXID:                   {"xid", true, false, "the GPU emits XID VALUE once"},
	KindECCUncorrected:        {"ecc-uncorrected", true, false, "adds VALUE volatile uncorrected ECC errors"},
	KindECCCorrected:          {"ecc-corrected", true, false, "adds VALUE volatile corrected ECC errors"},
	KindRowRemapPending:       {"row-remap-pending", false, false, "a row remapping waits for a GPU reset"},
	KindRowRemapFailed:        {"row-remap-failed", false, false, "a row remapping failed"},
	KindRetiredPages:          {"retired-pages", true, false, "adds VALUE retired pages (double-bit cause)"},
	KindPCIeGen:               {"pcie-gen", true, false, "the link trains at generation VALUE"},
	KindPCIeWidth:             {"pcie-width", true, false, "the link trains at VALUE lanes"},
	KindPCIeReplays:           {"pcie-replays", true, false, "adds VALUE PCIe replays"},
	KindNVLinkDown:            {"nvlink-down", true, false, "VALUE NVLink links go inactive"},
	KindNVLinkErrors:          {"nvlink-errors", true, false, "adds VALUE NVLink CRC errors"},
	KindTemperature:           {"temperature", true, false, "the GPU reads VALUE degrees Celsius"},
	KindFabricUnhealthy:       {"fabric-unhealthy", false, false, "NVSwitch fabric registration not completed"},
	KindGPULost:               {"gpu-lost", false, false, "NVML answers ERROR_GPU_IS_LOST for the GPU; it emits XID 79"},
	KindDriverUnloaded:        {"driver-unloaded", false, true, "NVML cannot initialise (ERROR_DRIVER_NOT_LOADED)"},
	KindGPUMissing:            {"gpu-missing", false, false, "the GPU is not enumerated (DeviceGetCount drops by one)"},
	KindDriverMismatch:        {"driver-mismatch", false, true, "the driver reports a version other than the profile's"},
	KindHWSlowdown:            {"hw-slowdown", false, false, "clock event reason HW slowdown (0x8) is active"},
	KindThermalSlowdown:       {"thermal-slowdown", false, false, "clock event reason HW thermal slowdown (0x40) is active"},
	KindPowerBrake:            {"power-brake", false, false, "clock event reason HW power brake (0x80) is active"},
	KindStrayProcess:          {"stray-process", true, false, "a compute process holds VALUE MiB on the GPU"},
	KindRowRemapUncorrectable: {"row-remap-uncorrectable", true, false, "adds VALUE rows remapped for uncorrectable errors"},
	KindRecoveryAction:        {"recovery-action", true, false, "the driver's recovery-action field reads VALUE (1 reset, 2 reboot, 4 drain and reset)"},
}

var kindByName = func() map[string]Kind {
	m := map[string]Kind{}
	for k := KindXID; k < kindCount; k++ {
		m[kinds[k].name] = k
	}
	return m
}()

// String is the kind's text name.
func (k Kind) String() string {
	if k <= KindUnspecified || k >= kindCount {
		return fmt.Sprintf("kind(%d)", int(k))
	}
	return kinds[k].name
}

// NodeLevel reports whether the kind applies to the node rather than one GPU.
func (k Kind) NodeLevel() bool { return k > KindUnspecified && k < kindCount && kinds[k].nodeLvl }

// TakesValue reports whether the kind needs a VALUE.
func (k Kind) TakesValue() bool { return k > KindUnspecified && k < kindCount && kinds[k].value }

// Fault is one fault to inject.
type Fault struct {
	Kind Kind
	// GPU is the NVML index of the GPU, or -1 for node-level kinds.
	GPU int
	// Value is the numeric argument; 0 for kinds without one.
	Value int64
}

// maxValue bounds VALUE so that counters cannot overflow when added up.
const maxValue = 1 << 40

// ParseFault parses the text form KIND[:VALUE][@gpuN], e.g. "xid:79@gpu3",
// "pcie-width:8@gpu1", "gpu-lost@gpu7", "driver-unloaded". Errors say what is wrong
// and list the kinds.
func ParseFault(spec string) (Fault, error) {
	bad := func(format string, args ...any) (Fault, error) {
		return Fault{}, fmt.Errorf("fault %q: %s", spec, fmt.Sprintf(format, args...))
	}
	rest := strings.TrimSpace(spec)
	if rest == "" {
		return bad("empty; want KIND[:VALUE][@gpuN], e.g. xid:79@gpu3")
	}
	f := Fault{GPU: -1}
	target := ""
	if at := strings.IndexByte(rest, '@'); at >= 0 {
		rest, target = rest[:at], rest[at+1:]
	}
	name, val, hasVal := strings.Cut(rest, ":")
	k, ok := kindByName[name]
	if !ok {
		return bad("unknown kind %q; kinds: %s", name, KindNames())
	}
	f.Kind = k
	switch {
	case k.TakesValue() && !hasVal:
		return bad("%s needs a value: %s:VALUE", name, name)
	case !k.TakesValue() && hasVal:
		return bad("%s takes no value", name)
	case hasVal:
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 || n > maxValue {
			return bad("value %q is not a decimal integer from 0 to %d", val, int64(maxValue))
		}
		f.Value = n
	}
	switch {
	case k.NodeLevel() && target != "":
		return bad("%s is node-level; drop @%s", name, target)
	case !k.NodeLevel() && target == "":
		return bad("%s needs a GPU: %s@gpuN", rest, rest)
	case target != "":
		idx, ok := strings.CutPrefix(target, "gpu")
		n, err := strconv.Atoi(idx)
		if !ok || err != nil || n < 0 || n > 63 || strconv.Itoa(n) != idx {
			return bad("target %q is not gpuN with N from 0 to 63", target)
		}
		f.GPU = n
	}
	if err := f.checkValue(); err != nil {
		return bad("%v", err)
	}
	return f, nil
}

func (f Fault) checkValue() error {
	switch f.Kind {
	case KindPCIeGen:
		if f.Value < 1 || f.Value > 6 {
			return fmt.Errorf("PCIe generation must be 1..6")
		}
	case KindPCIeWidth:
		switch f.Value {
		case 1, 2, 4, 8, 16, 32:
		default:
			return fmt.Errorf("PCIe width must be 1, 2, 4, 8, 16 or 32")
		}
	case KindTemperature:
		if f.Value > 200 {
			return fmt.Errorf("temperature must be at most 200 °C")
		}
	case KindXID:
		if f.Value < 1 || f.Value > 1000 {
			return fmt.Errorf("XID must be 1..1000")
		}
	case KindRecoveryAction:
		if f.Value > 7 {
			return fmt.Errorf("recovery action must be 0..7 (nvmlDeviceGpuRecoveryAction_t)")
		}
	}
	return nil
}

// String is the canonical text form; ParseFault(f.String()) == f.
func (f Fault) String() string {
	var b strings.Builder
	b.WriteString(f.Kind.String())
	if f.Kind.TakesValue() {
		b.WriteString(":" + strconv.FormatInt(f.Value, 10))
	}
	if !f.Kind.NodeLevel() {
		b.WriteString("@gpu" + strconv.Itoa(f.GPU))
	}
	return b.String()
}

// KindNames lists the kinds' text names, comma-separated.
func KindNames() string {
	names := make([]string, 0, kindCount)
	for k := KindXID; k < kindCount; k++ {
		names = append(names, kinds[k].name)
	}
	return strings.Join(names, ", ")
}

// Grammar is the fault-spec help text for --help.
func Grammar() string {
	var b strings.Builder
	b.WriteString("KIND[:VALUE][@gpuN], repeatable. Kinds:\n")
	for k := KindXID; k < kindCount; k++ {
		i := kinds[k]
		form := i.name
		if i.value {
			form += ":VALUE"
		}
		if !i.nodeLvl {
			form += "@gpuN"
		}
		fmt.Fprintf(&b, "  %-36s %s\n", form, i.help)
	}
	return b.String()
}

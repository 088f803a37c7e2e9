package snapshot

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestClockEventBitsMatchNVML: the mirrored constants must stay NVML's values. The
// test may import go-nvml; the package may not.
func TestClockEventBitsMatchNVML(t *testing.T) {
	for _, c := range []struct {
		name       string
		ours, nvml uint64
	}{
		{"GPUIdle", ClockEventGPUIdle, nvml.ClocksEventReasonGpuIdle},
		{"ApplicationsClocks", ClockEventApplicationsClocks, nvml.ClocksEventReasonApplicationsClocksSetting},
		{"SWPowerCap", ClockEventSWPowerCap, nvml.ClocksEventReasonSwPowerCap},
		{"HWSlowdown", ClockEventHWSlowdown, nvml.ClocksThrottleReasonHwSlowdown},
		{"SyncBoost", ClockEventSyncBoost, nvml.ClocksEventReasonSyncBoost},
		{"SWThermalSlowdown", ClockEventSWThermalSlowdown, nvml.ClocksEventReasonSwThermalSlowdown},
		{"HWThermalSlowdown", ClockEventHWThermalSlowdown, nvml.ClocksThrottleReasonHwThermalSlowdown},
		{"HWPowerBrakeSlowdown", ClockEventHWPowerBrakeSlowdown, nvml.ClocksThrottleReasonHwPowerBrakeSlowdown},
		{"DisplayClockSetting", ClockEventDisplayClockSetting, nvml.ClocksEventReasonDisplayClockSetting},
	} {
		if c.ours != c.nvml {
			t.Errorf("ClockEvent%s = %#x, NVML's is %#x", c.name, c.ours, c.nvml)
		}
	}
}

func TestValue(t *testing.T) {
	if v := Known(3); !v.OK() || v.V != 3 {
		t.Errorf("Known(3) = %+v", v)
	}
	if v := (Value[int]{Err: "ERROR_NOT_SUPPORTED", NotSupported: true}); v.OK() {
		t.Error("a Value with an error is OK")
	}
	s := Snapshot{GPUs: []GPU{{Index: 2}, {Index: 5}}}
	if g := s.ByIndex(5); g == nil || g != &s.GPUs[1] {
		t.Errorf("ByIndex(5) = %p, want the second entry", g)
	}
	if s.ByIndex(0) != nil {
		t.Error("ByIndex(0) found a GPU that is not there")
	}
}

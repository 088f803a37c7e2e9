package snapshot

// Clock event reasons: the bits of GPU.ClockEvents, as NVML defines them
// (nvmlClocksEventReasons in nvml.h; "throttle reasons" before driver 535). They are
// mirrored here so that checks can name them without importing go-nvml;
// snapshot_test.go holds them equal to go-nvml's.
const (
	ClockEventGPUIdle              uint64 = 0x1
	ClockEventApplicationsClocks   uint64 = 0x2
	ClockEventSWPowerCap           uint64 = 0x4
	ClockEventHWSlowdown           uint64 = 0x8
	ClockEventSyncBoost            uint64 = 0x10
	ClockEventSWThermalSlowdown    uint64 = 0x20
	ClockEventHWThermalSlowdown    uint64 = 0x40
	ClockEventHWPowerBrakeSlowdown uint64 = 0x80
	ClockEventDisplayClockSetting  uint64 = 0x100
)

package deviceplugin

import (
	"os"
	"strconv"
	"strings"
)

// SysfsNUMANode reads the NUMA node of the PCI device with NVML bus id busID
// ("00000000:18:00.0") from /sys/bus/pci/devices/0000:18:00.0/numa_node; -1 when
// unknown (no such file, or the kernel's -1 for a machine without NUMA).
func SysfsNUMANode(busID string) int {
	id := strings.ToLower(busID)
	if len(id) == len("00000000:18:00.0") {
		id = id[4:] // NVML's 8-digit domain; sysfs has 4
	}
	data, err := os.ReadFile("/sys/bus/pci/devices/" + id + "/numa_node")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

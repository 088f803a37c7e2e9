package cditest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gpurack/gpurack/agent/cdi"
)

func TestSimulatedDevices(t *testing.T) {
	null := fmt.Sprintf("c %d:%d", cdi.SimMajor, cdi.SimMinor)
	good := "/dev/nvidia-uvm " + null + "\n/dev/nvidia3 " + null + "\n/dev/nvidia1 " + null + "\n/dev/nvidiactl " + null + "\n" + cdi.SimulatedEnv + "=true\n"
	if idx, problems := SimulatedDevices(good, 2); !slices.Equal(idx, []int{1, 3}) || len(problems) > 0 {
		t.Errorf("good answer: %v %q", idx, problems)
	}
	for name, got := range map[string]string{
		"a GPU too many":     good + "/dev/nvidia5 " + null + "\n",
		"a real device":      "/dev/nvidia0 c 195:0\n/dev/nvidia1 " + null + "\n/dev/nvidiactl " + null + "\n/dev/nvidia-uvm " + null + "\n" + cdi.SimulatedEnv + "=true\n",
		"not labelled":       "/dev/nvidia0 " + null + "\n/dev/nvidia1 " + null + "\n/dev/nvidiactl " + null + "\n/dev/nvidia-uvm " + null + "\n",
		"no nvidiactl":       "/dev/nvidia0 " + null + "\n/dev/nvidia1 " + null + "\n/dev/nvidia-uvm " + null + "\n" + cdi.SimulatedEnv + "=true\n",
		"an unexpected node": good + "/dev/nvidia-modeset " + null + "\n",
		"nothing at all":     "",
	} {
		if _, problems := SimulatedDevices(got, 2); len(problems) == 0 {
			t.Errorf("%s: no problem found in\n%s", name, got)
		}
	}
}

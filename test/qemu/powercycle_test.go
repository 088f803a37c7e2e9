//go:build linux

package qemu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestPowerCycleFigures (GPURACK_BENCH_POWERCYCLE=1, docs/bench/powercycle.md) measures
// a power cycle of one QEMU machine to its Node Ready again, two ways in the same run,
// alternating, GPURACK_POWERCYCLE_RUNS times each (default 3):
//
//   - redfish: `gpuboot machines power cycle NODE`: gpuboot opens a Redfish session
//     with the machine's BMC (pxe/bmc/redfishtest), posts PowerCycle and follows the
//     task; the BMC stops the machine's QEMU and starts a new one (Rack.bmcReset);
//   - direct: the test stops the QEMU and starts a new one itself, as the BMC does,
//     with no gpuboot, Redfish or session in the way (the peer).
//
// The figure is the command (or the kill) to the Node Ready on a new boot id, the
// machine ready in gpuboot and gpurack.io/unvalidated lifted. The machine has a TPM
// (swtpm, the same state every boot) and gpuboot identity: tpm, so each boot
// re-enrolls at once on its proved EK; without one, a new key waits 3 minutes for
// the old to be taken for gone, which would swamp the figure. Figures are appended to
// GPURACK_POWERCYCLE_FIGURES when set.
func TestPowerCycleFigures(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_POWERCYCLE", "six reboots of a QEMU machine, about 20 minutes (docs/bench/powercycle.md)")
	testreq.Tool(t, "swtpm", "apt-get install swtpm swtpm-tools (make deps installs it)")
	runs := 3
	if v := os.Getenv("GPURACK_POWERCYCLE_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPURACK_POWERCYCLE_RUNS=%q: want a count of at least 1", v)
		}
		runs = n
	}
	spec := MachineSpec{Node: joinNode, MAC: joinMAC, IP: poweronNodeIP, Serial: joinSerial, UUID: joinUUID, TPMDir: t.TempDir(), BMC: true}
	r := startRack(t, RackOptions{Machines: []MachineSpec{spec}, Enrollment: "{unknownMachines: discover, identity: tpm}"})

	took := map[string][]time.Duration{}
	var lines []string
	for i := range runs {
		order := []string{"redfish", "direct"}
		if i%2 == 1 {
			order = []string{"direct", "redfish"}
		}
		for _, way := range order {
			d := r.cycleToReady(t, spec, way)
			took[way] = append(took[way], d)
			lines = append(lines, fmt.Sprintf("power cycle to Node Ready (%s)\t%.1f", way, d.Seconds()))
			t.Logf("run %d, %s: power cycle to Node Ready on a new boot id %s", i+1, way, d.Round(100*time.Millisecond))
		}
	}
	rf, direct := median(took["redfish"]), median(took["direct"])
	t.Logf("power cycle to Node Ready, QEMU -accel tcg, n=%d each, alternating: redfish median %s %v, direct median %s %v, ratio %.3f",
		runs, rf.Round(100*time.Millisecond), took["redfish"], direct.Round(100*time.Millisecond), took["direct"], rf.Seconds()/direct.Seconds())
	if path := os.Getenv("GPURACK_POWERCYCLE_FIGURES"); path != "" {
		if err := appendFigures(path, lines); err != nil {
			t.Errorf("GPURACK_POWERCYCLE_FIGURES: %v", err)
		}
	}
}

// cycleToReady power-cycles the rack's one machine (spec) the way named (redfish or
// direct, TestPowerCycleFigures) and returns the time until its Node is Ready on a
// new boot id, the machine ready in gpuboot and its Node untainted.
func (r *Rack) cycleToReady(t *testing.T, spec MachineSpec, way string) time.Duration {
	t.Helper()
	node, err := r.admin.CoreV1().Nodes().Get(r.ctx, spec.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Node %s before the %s cycle: %v", spec.Node, way, err)
	}
	oldBoot := node.Status.NodeInfo.BootID
	t0 := time.Now()
	var m *RackMachine
	switch way {
	case "redfish":
		out := r.g.cli(t, "machines", "power", "cycle", spec.Node, "--reason", "TestPowerCycleFigures")
		select {
		case m = <-r.powered:
		case <-time.After(5 * time.Minute):
			t.Fatalf("`machines power cycle` said %q but the BMC powered nothing on within 5 min:\n%s", out, r.bmcLines())
		}
	case "direct":
		r.mu.Lock()
		r.Machines[0].powerOff()
		m = r.powerOn(t, spec)
		t.Cleanup(m.powerOff)
		r.Machines[0] = m
		r.mu.Unlock()
	default:
		t.Fatalf("cycleToReady: way %q: want redfish or direct", way)
	}
	waitFor(t, r.ctx, 6*time.Minute, spec.Node+" Ready on a new boot id and ready in gpuboot after the "+way+" cycle", func() bool {
		n, err := r.admin.CoreV1().Nodes().Get(r.ctx, spec.Node, metav1.GetOptions{})
		if err != nil || n.Status.NodeInfo.BootID == oldBoot || nodeHasTaint(n, "gpurack.io/unvalidated") {
			return false
		}
		rd := nodeCondition(n, corev1.NodeReady)
		return rd != nil && rd.Status == corev1.ConditionTrue &&
			r.g.machine(t, spec.MAC).GetState() == bootv1.MachineState_MACHINE_STATE_READY
	}, func() string {
		var enroll []string
		for _, l := range strings.Split(r.g.log.String(), "\n") {
			if strings.Contains(l, "enroll") || strings.Contains(l, "egister") || strings.Contains(l, "TPM") {
				enroll = append(enroll, l)
			}
		}
		return fmt.Sprintf("gpuboot: machine %s\n%s\ngpuboot's enrollment lines:\n%s", r.g.machine(t, spec.MAC).GetState(),
			strings.TrimSpace(r.bmcLines()), lastLines(strings.Join(enroll, "\n"), 30))
	}, m.con.tail)
	return time.Since(t0)
}

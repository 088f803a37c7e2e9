//go:build linux

package qemu

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// rackMachines is TestRack's rack: machine A powers on through its firmware and boots
// the tiny image, machine B boots the simulated GPU image (its kernel and initrd from
// the boot script gpuboot gives it, which the iPXE path has already shown on A).
var rackMachines = []MachineSpec{
	{Node: joinNode, MAC: joinMAC, IP: poweronNodeIP, Serial: joinSerial, UUID: joinUUID, PXE: true},
	{Node: "gpu-r1-sim", MAC: "52:54:00:e2:e0:22", IP: "10.0.2.22", Serial: "GPR-SIM-0002", UUID: "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e22", Image: imageSimGPU, BMC: true, PXE: true},
}

// TestRack is the whole life of a rack's nodes, nothing simulated but the GPUs of the
// simulated GPU image: two diskless machines power on at once on one boot network,
// against the real control plane (`controlplane-bootstrap init --foreground`) and
// `gpuboot serve` in a network namespace, and become Ready Nodes (startRack checks
// every step of that: registration and the key on the console, approval with the
// operator CLI, the JoinBundle, kubelet's Node, commissioning, the pod network). The
// machines boot once; every node-level check then runs against them as a subtest:
//
//   - power-on milestones: machine A's DHCP, iPXE, the image, systemd, the agent, each
//     seen in gpuboot's log, the console, gpuboot's history and the Kubernetes API;
//   - a first pod (the preloaded pause image) Running on A;
//   - Services and DNS: a pod on A reaches the apiserver through the kubernetes
//     Service's ClusterIP and resolves names through CoreDNS;
//   - the pod network across nodes: a pod on A reaches a pod on B by its pod IP and
//     through a ClusterIP Service (flannel vxlan, the JoinBundle's backend);
//   - then, at once on the two nodes: on A the restart hold (gpuagent and kube-proxy
//     restarted under a held connection) and tenant isolation (NetworkPolicies); on B
//     GPUs to pods (the device plugin, CDI, XID withdrawal, a kubelet restart) and its
//     data disks (a blank one prepared, a foreign one refused and left byte-identical,
//     then wiped by an operator through gpuboot and prepared); after tenant isolation,
//     the cluster registry (registry.enabled, gpuboot's cluster.registry): a user of
//     alpha pushes the probe image with skopeo, a pod in alpha pulls and runs it, a pod
//     in beta is refused it; on B, once the tenants are applied, a user's day in the
//     job queues (queues.enabled): a user of alpha queues a training Job on B's
//     simulated GPUs with a checkpoint per epoch on a gpurack-local volume, its pod
//     deleted mid-run and the next pod resuming from the checkpoint, a second Job over
//     alpha's GPUs waiting with Kueue's reason and started when the first ends (the
//     time logged: queuedTraining), the trained model then served by 2 replicas
//     behind a Service and asked through kubectl port-forward (serveModel); then a
//     user of alpha and one of beta queue 1-GPU Jobs past their quotas: alpha borrows
//     beta's idle GPU and Kueue reclaims it for beta's Job (borrowAndReclaim); then
//     A gets kubectl exec, kubectl logs and kubectl debug node with the debug image (a
//     command, an interactive shell), the node's journal and the audit log checked;
//   - the central log store (monitoring.logs, gpuboot's cluster.logsEndpoint): A's
//     debug pod's output and break-glass journal lines read back with
//     `controlplane-bootstrap logs`; on B a 1 MiB container line stored cut at 64 KiB,
//     and journald's rate beside the shipper's (figures);
//   - then the metrics server that `init` started (monitoring.enabled, scraping every
//     15 s, Alertmanager routing every alert to a webhook in the namespace): every
//     node's gpuagent, node_exporter, kubelet and cAdvisor scraped through the Node
//     objects with the monitoring certificate, the control plane's jobs,
//     kube-state-metrics', the log store's, Kueue's and gpuboot's up; the XID 79 that B's GPU
//     subtest injected at the webhook as GpurackXIDFatal with the node, the GPU, its
//     Hostname (the node's name) and the runbook link; a gpurack-local volume B's
//     volume subtest filled to 60 of 64 MiB at the webhook as GpurackVolumeNearlyFull
//     (its `for: 5m` ran while the node checks did);
//   - then B's agent's memory: sampled every 15 s through its /metrics from Ready to
//     here, then read by mapping (probe mem);
//   - last, B is rolled out to another image (`gpuboot rollout start`: pinned, drained,
//     power-cycled through its Redfish BMC, whose reset restarts its QEMU, which
//     PXE-boots through its firmware, like A, the image gpuboot's boot script now
//     names): it re-enrolls, joins on the new image, mounts both data disks as they were, and
//     verifies 200 MiB written on one before and its gpurack-local volume; meanwhile
//     A's gpuagent is killed and kept down, and after the rollout GpurackAgentMissing
//     for A is at the webhook, and B's boot before the rollout is in the log store
//     with its gpuagent lines.
//
// GPURACK_HOLD_RUNS=N repeats the restart hold N times on the one boot and logs the
// pass count.
//
// It replaces TestTinyNodeJoin, TestPowerOnToNode and TestTwoNodePodNetwork/vxlan,
// which booted four machines against three control planes for the same checks
// (docs/testing.md lists them before and after). GPURACK_E2E_LOGS=DIR keeps A's serial
// console, gpuboot's log and the milestones; GPURACK_JOIN_JOURNAL=1 puts the guests'
// journals on their consoles.
func TestRack(t *testing.T) {
	disks := makeRackDisks(t, t.TempDir())
	machines := slices.Clone(rackMachines)
	machines[1].Disks = disks.disks
	r := startRack(t, RackOptions{Machines: machines, ExtraImages: []string{imageSimGPUNext}})
	a, b := r.Machines[0], r.Machines[1]
	t.Logf("timings: power-on -> waiting for approval %s (A, PXE) and %s (B); approve -> Ready %s and %s",
		a.bootToWait.Round(time.Second), b.bootToWait.Round(time.Second), a.toReady.Round(time.Second), b.toReady.Round(time.Second))
	// B's agent, every service on, sampled from Ready to the end of the checks.
	memory, err := startAgentMemory(r.ctx, r.ns, b.IP, r.cp.dir, rackScrape)
	if err != nil {
		t.Fatal(err)
	}
	var prepared map[string]*machinev1.DataDisk // B's data disks at the end of their subtest
	var xidAt time.Time                         // when B's GPU subtest injected XID 79
	localReady := false                         // keepClaim holds keepFile
	var full *volumeFault                       // fullClaim, filled for the disk alert

	t.Run("power-on milestones", func(t *testing.T) { checkMilestones(t, a) })
	t.Run("first pod", func(t *testing.T) { runFirstPod(t, r.ctx, r.admin, a.ms, a.Node) })
	t.Run("Services and DNS", func(t *testing.T) { runProbePod(t, r.ctx, r.admin, a.node) })
	t.Run("pod network across nodes", func(t *testing.T) {
		if a.node.Spec.PodCIDR == b.node.Spec.PodCIDR {
			t.Fatalf("both Nodes have podCIDR %s", a.node.Spec.PodCIDR)
		}
		crossNodeFetch(t, r.ctx, r.admin, a.node, b.node, "vxlan")
	})
	// The two nodes' own checks touch only their own node, so they run at once, and
	// so do B's two branches (TestMain lets three subtests run in parallel): its GPU
	// checks and its data disks' checks until the latter reach the job queues, which
	// take B's GPUs and so wait for the GPU checks to end (gpusChecked).
	gpusChecked := make(chan struct{})
	t.Run("nodes", func(t *testing.T) {
		t.Run(a.Node, func(t *testing.T) {
			t.Parallel()
			var restarted int
			runs := holdRuns(t)
			passed := 0
			for i := range runs {
				name := "restart hold"
				if runs > 1 {
					name = fmt.Sprintf("restart hold %d of %d", i+1, runs)
				}
				if t.Run(name, func(t *testing.T) { restarted = restartNodeServices(t, r.ctx, r.admin, a.node, a.con, i) }) {
					passed++
				}
			}
			if runs > 1 {
				t.Logf("restart hold: %d of %d consecutive runs passed (GPURACK_HOLD_RUNS=%d, load %s)", passed, runs, runs, loadAverage())
			}
			t.Run("tenant isolation", func(t *testing.T) {
				tenantIsolation(t, r.ctx, r.env, r.ns, r.bins.controlplane, r.cp, r.admin, a.node, a.con, restarted)
				t.Run("registry pull", func(t *testing.T) { registryPull(t, r.ctx, r.env, r.ns, r.bins.controlplane, r.cp, r.admin, a.node) })
			})
			t.Run("logs, exec and break-glass", func(t *testing.T) { checkLogsExecAndBreakGlass(t, r, a.node) })
			// Node A serves the NFS export; pods on both nodes use it.
			t.Run("gpurack-shared volumes", func(t *testing.T) { checkSharedVolumes(t, r, a.node, b.node) })
		})
		t.Run(b.Node+" GPUs", func(t *testing.T) {
			t.Parallel()
			defer close(gpusChecked)
			if os.Getenv("GPURACK_JOIN_IMAGE") != "" {
				testreq.NotApplicable(t, "GPURACK_JOIN_IMAGE: node B boots that image, not the simulated GPU image built from this tree; unset it to run these checks (make test refuses it)")
			}
			simGPUNodeChecks(t, r.ctx, r.admin, r.g, b.node, b.IP, &xidAt, func() { awaitXIDScraped(t, r, b.Node) })
		})
		t.Run(b.Node+" data disks", func(t *testing.T) {
			t.Parallel()
			prepared = checkDataDisks(t, r.ctx, r.g, r.admin, b, disks)
			t.Run("gpurack-local volumes", func(t *testing.T) {
				checkLocalVolumes(t, r.ctx, r.admin, b.node, &full)
				localReady = !t.Failed()
			})
			// The log shipper's checks on a node run here, beside B's GPU checks.
			t.Run("a 1 MiB container line in the log store", func(t *testing.T) { checkLongLine(t, r, b.node) })
			t.Run("the node's API load balancer", func(t *testing.T) { checkNodeAPILB(t, r, b.Node) })
			select {
			case <-gpusChecked:
			case <-r.ctx.Done():
				t.Fatal(r.ctx.Err())
			}
			t.Run("a user's training Job through alpha's queue", func(t *testing.T) {
				if os.Getenv("GPURACK_JOIN_IMAGE") != "" {
					testreq.NotApplicable(t, "GPURACK_JOIN_IMAGE: node B boots that image, without the simulated GPUs the Job asks for")
				}
				queuedTraining(t, r, b.node)
			})
			t.Run("two tenants borrow and reclaim GPUs through the queues", func(t *testing.T) {
				if os.Getenv("GPURACK_JOIN_IMAGE") != "" {
					testreq.NotApplicable(t, "GPURACK_JOIN_IMAGE: node B boots that image, without the simulated GPUs the Jobs ask for")
				}
				borrowAndReclaim(t, r, b.node)
			})
			if figures := os.Getenv("GPURACK_STORAGE_FIGURES"); figures != "" {
				t.Run("storage bench", func(t *testing.T) { benchLocalVolume(t, r.ctx, r.admin, b.node, figures) })
			}
		})
	})
	t.Run("metrics and alerts", func(t *testing.T) {
		checkRackMetrics(t, r, r.alerts, []string{a.Node, b.Node}, b.Node, xidAt)
	})
	t.Run("a filled volume's alert", func(t *testing.T) { checkVolumeAlert(t, r, full) })
	// After the volume's alert: the flood it makes loads B, whose kubelet's scrapes
	// then time out (10 s) and reset the alert's 5 minutes.
	t.Run("log shipping against journald on "+b.Node, func(t *testing.T) { benchLogShipping(t, r, b.node) })
	t.Run("gpuagent memory on "+b.Node, func(t *testing.T) {
		summary, err := memory.finish(12)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("gpuagent on %s (simulated GPUs, every node service on, /metrics scraped by this sampler): %s", b.Node, summary)
		t.Logf("gpuagent on %s by mapping, at the end:\n%s", b.Node, agentMappings(t, r.ctx, r.admin, b.node))
	})
	// Last, as it takes B down: a rollout moves B to another image (drain, a power
	// cycle through its Redfish BMC, commissioning), and its data disks and their data
	// survive it (powerCycleDataDisks).
	// A's agent is killed and kept down while B rolls out: its alert holds for 5
	// minutes, about the rollout's time; it is checked last.
	var agentKilled time.Time
	t.Run("kill gpuagent on "+a.Node, func(t *testing.T) { agentKilled = killAgent(t, r.ctx, r.admin, a.node) })
	rollout := time.Now()
	t.Run(b.Node+" data disks after a rollout to another image", func(t *testing.T) {
		if prepared == nil {
			t.Fatal("the data-disk subtest did not get to the end; nothing to check after a power cycle")
		}
		powerCycleDataDisks(t, r, b, prepared, localReady)
	})
	t.Run(b.Node+"'s logs from before the rollout", func(t *testing.T) { checkPreviousBoot(t, r, b.Node, rollout) })
	t.Run("a killed gpuagent on "+a.Node, func(t *testing.T) {
		if agentKilled.IsZero() {
			t.Fatal("the agent was not killed")
		}
		checkAgentAlert(t, r.ctx, r.alerts, a.Node, agentKilled)
	})
}

// holdRuns is how many times the restart hold runs in a row (GPURACK_HOLD_RUNS,
// default 1): its pass count over consecutive runs is how a flaky hold shows.
func holdRuns(t *testing.T) int {
	v := os.Getenv("GPURACK_HOLD_RUNS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 50 {
		t.Fatalf("GPURACK_HOLD_RUNS=%q: want a count from 1 to 50", v)
	}
	return n
}

// loadAverage is the host's 1, 5 and 15 minute load averages, for a figure's
// conditions.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// checkMilestones checks a PXE machine's power-on milestones: each was seen, and
// those of the network boot before the agent waited for approval (the initramfs lease
// and switch_root are logged, not required: their console lines are the kernel's).
func checkMilestones(t *testing.T, m *RackMachine) {
	m.ms.scan()
	wait, ok := m.ms.at(msWaiting)
	if !ok {
		t.Fatalf("no %q milestone", msWaiting)
	}
	netboot := []string{msDHCP, msScript, msKernel, msInitrd, msRootfs, msVerified}
	for _, name := range append(netboot, msSystemd, msApproveCmd, msRegistered, msApproved, msBundle, msNode, msCommissioning,
		msReported, msNodeReady, msMachineReady) {
		at, ok := m.ms.at(name)
		switch {
		case !ok:
			t.Errorf("milestone %q not reached", name)
		case slices.Contains(netboot, name) && at > wait:
			t.Errorf("milestone %q at %s, after the agent waited for approval (%s)", name, at.Round(time.Millisecond), wait.Round(time.Millisecond))
		}
	}
	t.Logf("power-on milestones so far:\n%s", m.ms.table())
}

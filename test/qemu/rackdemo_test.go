//go:build linux && demoqemu

package qemu

// This file is `make demo-qemu`, not part of `make test`: the build tag keeps it out
// of every other build. It is a test so that it can stand on the power-on rig that
// TestPowerOnToNode proves in CI (netns boot network, namespaced control plane and
// gpuboot, the gpuimage-built tiny image), and so that what it shows is also checked.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The demo rack: slot 1 is the QEMU machine (joinMAC, joinSerial), the others are
// simulated 8-GPU servers. Slot 7 has an XID 79 on GPU 3 from power-on (quarantined);
// slot 12 gets an uncorrectable ECC error on GPU 5 once the rack is ready (that GPU
// alone is withdrawn), as in `make demo`.
const (
	demoQuarantineSlot = 7
	demoECCSlot        = 12
	demoAgentPort      = 29100 // + slot: each simulated agent's API, on joinHost
	demoGossipPort     = 29300 // + slot: each simulated agent's gossip, on joinHost
)

// TestRackDemoQEMU is `make demo-qemu`: `make demo`'s rack with slot 1 a real QEMU
// machine that powers on and PXE-boots exactly as in TestPowerOnToNode (SeaBIOS, the
// iPXE ROM, gpuboot's DHCP, /boot.ipxe, the signed tiny image, gpurack-init, systemd,
// gpuagent), and the other NODES-1 (default 19) simulated gpuagent processes. The
// allowlist built from the vendor manifest approves all of them (no operator step),
// enrollment.allowSimulated lets the simulated ones be ready. It prints a line per
// machine state change, the QEMU machine's milestones, the rack checklist, the nodes
// and where the 8-GPU pod went, and writes the checklist (markdown, JSON, HTML), the
// serial console and gpuboot's log under DEMO_DIR (default $TMPDIR/gpurack-rack-demo-qemu).
// Everything it started stops when it ends, also on Ctrl-C.
func TestRackDemoQEMU(t *testing.T) {
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	testreq.Tool(t, "dnsmasq", "apt-get install dnsmasq-base (make deps installs it)")
	testreq.File(t, poweronROM, "apt-get install ipxe-qemu (make deps installs it)")
	nodes := 20
	if v := os.Getenv("NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < demoECCSlot {
			t.Fatalf("NODES=%q: want a whole number of at least %d (slot %d gets the ECC error)", v, demoECCSlot, demoECCSlot)
		}
		nodes = n
	}
	out := os.Getenv("DEMO_DIR")
	if out == "" {
		out = filepath.Join(os.TempDir(), "gpurack-rack-demo-qemu")
	}
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	t.Cleanup(stop)
	ctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
	t.Cleanup(cancel)
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%7.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	step := func(s string) { fmt.Printf("\n\033[1m== %s\033[0m\n", s) }

	step("0. Build: the four binaries and the tiny image (kernel, initrd, signed rootfs)")
	say("building (about 3 minutes the first time on 2 cores, from the image cache after that; GPURACK_JOIN_IMAGE=DIR reuses an image)")
	agentBin := buildDemoAgent(t)

	step("1. The boot network (a bridge in a network namespace), the control plane, gpuboot with the rack's allowlist")
	manifest := filepath.Join(out, "rack-r1.csv")
	rows := []string{"serial,mac,rack,slot", fmt.Sprintf("%s,%s,r1,01", joinSerial, joinMAC)}
	for i := 2; i <= nodes; i++ {
		rows = append(rows, fmt.Sprintf("SN-R1-%02d,02:00:00:00:01:%02x,r1,%02d", i, i, i))
	}
	if err := os.WriteFile(manifest, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	say("vendor manifest %s: %d rows, slot 1 is the QEMU machine (%s, %s)", manifest, nodes, joinSerial, joinMAC)
	// Every simulated machine calls from joinHost: that one address gets the rack's
	// share of the per-source limit, as in make demo.
	slot1 := MachineSpec{Node: "slot01-qemu", MAC: joinMAC, IP: poweronNodeIP, Serial: joinSerial, UUID: joinUUID, PXE: true}
	r := startRack(t, RackOptions{Machines: []MachineSpec{slot1}, NoPowerOn: true,
		Policy:     fmt.Sprintf("{approval: allowlist, allowlist: %s}", manifest),
		Enrollment: fmt.Sprintf("{unknownMachines: discover, allowSimulated: true, sourceRate: %d, sourceBurst: %d}", nodes*5, nodes*50)})
	ns, admin, g := r.ns, r.admin, r.g
	imageID := r.images.ids[imageTiny]
	say("image %s; namespace %s, bridge %s with %s; control plane up (https://%s)", imageID, ns, r.bridge.Name, joinHost, joinAPI)
	say("gpuboot serving DHCP and TFTP on %s, HTTP %s, TLS %s; policy: approval allowlist; enrollment.allowSimulated: true (the %d simulated nodes are labelled gpurack.io/simulated)",
		r.bridge.Name, joinHTTP, joinTLS, nodes-1)

	step(fmt.Sprintf("2. Power on: slot 1 in QEMU (TCG, PXE), slots 2-%d simulated (slot %d has an XID 79 on GPU 3)", nodes, demoQuarantineSlot))
	t.Setenv("GPURACK_E2E_LOGS", out) // the milestones, serial console and gpuboot log are kept there
	qm := r.powerOn(t, slot1)
	con, ms := qm.con, qm.ms
	for i := 2; i <= nodes; i++ {
		startDemoAgent(t, ns, agentBin, filepath.Join(out, "nodes", fmt.Sprintf("slot%02d", i)), i, g.pin)
	}
	say("QEMU powered on; %d gpuagent processes started", nodes-1)

	step("3. Every machine through registration, allowlist approval, JoinBundle, commissioning")
	seen := map[string]string{}
	var machines []*bootv1.Machine
	waitFor(t, ctx, bootToWaitLimit+approveToNode+nodeToReady, "every machine ready or quarantined", func() bool {
		machines = g.machines(t)
		done := 0
		for _, m := range machines {
			state := strings.ToLower(strings.TrimPrefix(m.GetState().String(), "MACHINE_STATE_"))
			if seen[m.GetId()] != state {
				seen[m.GetId()] = state
				say("slot %-2s %-12s %-14s %s", m.GetSlot(), m.GetNodeName(), state, m.GetIdentity().GetSerial())
			}
			switch m.GetState() {
			case bootv1.MachineState_MACHINE_STATE_READY, bootv1.MachineState_MACHINE_STATE_QUARANTINED:
				done++
			}
		}
		return done >= nodes
	}, func() string { return fmt.Sprintf("states: %v\n%s", seen, con.tail()) })
	say("all %d machines commissioned", nodes)
	qemuNode := ""
	for _, m := range machines {
		if m.GetIdentity().GetBootMac() == joinMAC {
			qemuNode = m.GetNodeName()
			if m.GetState() != bootv1.MachineState_MACHINE_STATE_READY {
				t.Errorf("the QEMU machine is %s, want ready", m.GetState())
			}
		}
		if m.GetSlot() == fmt.Sprintf("%02d", demoQuarantineSlot) && m.GetState() != bootv1.MachineState_MACHINE_STATE_QUARANTINED {
			t.Errorf("slot %d (XID 79 at power-on) is %s, want quarantined", demoQuarantineSlot, m.GetState())
		}
	}
	if qemuNode == "" {
		t.Fatalf("gpuboot lists no machine with the QEMU machine's MAC %s", joinMAC)
	}
	ms.history(g.machine(t, joinMAC))

	step("4. The QEMU node: Node Ready (pod network up) and a pod Running on it")
	waitFor(t, ctx, nodeToReady, "Node "+qemuNode+" Ready", func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, qemuNode, metav1.GetOptions{})
		if err != nil {
			return false
		}
		r := nodeCondition(n, corev1.NodeReady)
		if r != nil && r.Status == corev1.ConditionTrue {
			ms.record(msNodeReady, r.LastTransitionTime.Time, "Kubernetes API: Ready=True")
			return true
		}
		return false
	})
	runFirstPod(t, ctx, admin, ms, qemuNode)
	say("%s is Ready and runs first-pod", qemuNode)

	step(fmt.Sprintf("5. After the rack is ready: an uncorrectable ECC error on slot %d, GPU 5 (withdrawn alone, the node keeps 7)", demoECCSlot))
	eccNode := fmt.Sprintf("gpu-r1-%02d", demoECCSlot)
	allocatable := func() int64 {
		n, err := admin.CoreV1().Nodes().Get(ctx, eccNode, metav1.GetOptions{})
		if err != nil {
			return -1
		}
		q := n.Status.Allocatable["nvidia.com/gpu"]
		return q.Value()
	}
	if got := allocatable(); got != 8 {
		t.Fatalf("%s has %d allocatable nvidia.com/gpu before the ECC error, want 8", eccNode, got)
	}
	t0 := time.Now()
	injectDemoFault(t, ctx, filepath.Join(out, "nodes", fmt.Sprintf("slot%02d", demoECCSlot), "agent.sock"), "ecc-uncorrected:1@gpu5")
	for allocatable() != 7 {
		if time.Since(t0) > time.Minute || ctx.Err() != nil {
			t.Fatalf("%s still has %d allocatable nvidia.com/gpu a minute after the ECC error on GPU 5", eccNode, allocatable())
		}
		time.Sleep(100 * time.Millisecond)
	}
	say("%s: allocatable nvidia.com/gpu 8 -> 7 after %s", eccNode, time.Since(t0).Round(100*time.Millisecond))

	step("6. The rack commissioning checklist")
	wantGPUs := (nodes-2)*8 - 1 // the simulated nodes but slot 7, less slot 12's GPU 5; the tiny image has no GPU
	var totals struct{ NodesReady, NodesQuarantined, GpusAllocatable int }
	var report string
	waitFor(t, ctx, time.Minute, fmt.Sprintf("the rack report's totals: %d ready, 1 quarantined, %d GPUs allocatable", nodes-1, wantGPUs), func() bool {
		out, err := g.env.Run(ns, g.bin, "rack", "report", "r1", "--format", "json", "--server", joinTLS, "--credentials", g.creds)
		if err != nil {
			return false
		}
		report = out
		var r struct {
			Totals struct{ NodesReady, NodesQuarantined, GpusAllocatable int }
		}
		if json.Unmarshal([]byte(out), &r) != nil {
			return false
		}
		totals = r.Totals
		return totals.NodesReady == nodes-1 && totals.NodesQuarantined == 1 && totals.GpusAllocatable == wantGPUs
	}, func() string { return fmt.Sprintf("totals %+v", totals) })
	fmt.Print(g.cli(t, "rack", "report", "r1"))
	html := g.cli(t, "rack", "report", "r1", "--format", "html")
	for name, data := range map[string]string{"rack-r1.json": report, "rack-r1.html": html} {
		if err := os.WriteFile(filepath.Join(out, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	say("JSON: %s", filepath.Join(out, "rack-r1.json"))
	say("HTML: %s", filepath.Join(out, "rack-r1.html"))

	step("7. The nodes")
	list, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(list.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	fmt.Printf("%-12s %-6s %-5s %-10s %s\n", "NAME", "READY", "GPUS", "SIMULATED", "TAINTS")
	for _, n := range list.Items {
		ready := "-"
		if r := nodeCondition(&n, corev1.NodeReady); r != nil {
			ready = string(r.Status)
		}
		q := n.Status.Allocatable["nvidia.com/gpu"]
		var taints []string
		for _, tt := range n.Spec.Taints {
			taints = append(taints, tt.Key)
		}
		fmt.Printf("%-12s %-6s %-5d %-10s %s\n", n.Name, ready, q.Value(), n.Labels["gpurack.io/simulated"], strings.Join(taints, ","))
	}

	step("8. A pod asking for 8 GPUs is bound to a healthy node")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-8gpu", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "train", Image: "registry.k8s.io/pause:3.10.1",
			ImagePullPolicy: corev1.PullNever,
			Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}}}}},
	}
	if _, err := admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := ""
	waitFor(t, ctx, time.Minute, "train-8gpu bound to a node", func() bool {
		p, err := admin.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil {
			bound = p.Spec.NodeName
		}
		return bound != ""
	})
	if bad := []string{qemuNode, fmt.Sprintf("gpu-r1-%02d", demoQuarantineSlot), eccNode}; slices.Contains(bad, bound) {
		t.Errorf("train-8gpu was bound to %s, one of %v (no GPUs, quarantined, or 7 GPUs)", bound, bad)
	}
	say("train-8gpu bound to %s (simulated nodes run no kubelet: the binding is what this shows)", bound)
	step(fmt.Sprintf("Done in %s; stopping everything (the checklist, serial console and gpuboot log stay in %s)", time.Since(start).Round(time.Second), out))
}

// buildDemoAgent builds gpuagent for the simulated nodes (cgo on, as make build).
func buildDemoAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./agent/cmd/gpuagent")
	cmd.Dir, cmd.Env = "../..", append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build gpuagent: %v\n%s", err, out)
	}
	return filepath.Join(dir, "gpuagent")
}

// startDemoAgent starts the simulated machine of slot i as make demo does (its own
// serial, MAC and UUID under a facts root), in ns, calling gpuboot at joinTLS. Slot 2
// listens for gossip on joinHost's memberlist port, the seed gpuboot's JoinBundle names
// for the QEMU node (the first address of the rack's other machines).
func startDemoAgent(t *testing.T, ns, bin, dir string, i int, pin string) {
	t.Helper()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"sys/class/dmi/id", "proc", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{
		"sys/class/dmi/id/product_serial": fmt.Sprintf("SN-R1-%02d\n", i),
		"sys/class/dmi/id/product_uuid":   fmt.Sprintf("4C4C4544-0000-1000-8000-%012X\n", i),
		"proc/cmdline":                    fmt.Sprintf("console=ttyS0 BOOTIF=01-02-00-00-00-01-%02x quiet\n", i),
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gossip := fmt.Sprintf("%s:%d", joinHost, demoGossipPort+i)
	if i == 2 {
		gossip = joinHost + ":7946"
	}
	profile, err := filepath.Abs("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--gpu-backend", "sim:dgxh100", "--profile", profile,
		"--sim-seed", fmt.Sprintf("r1-slot%02d", i), "--enroll", joinTLS, "--enroll-ca", pin,
		"--key-dir", filepath.Join(root, "run"), "--facts-root", root,
		"--listen", fmt.Sprintf("%s:%d", joinHost, demoAgentPort+i), "--metrics-listen", "", "--socket", filepath.Join(dir, "agent.sock"),
		"--gossip-bind", gossip, "--gossip-seed", joinHost + ":7946", "--gossip-local", "--kubelet-dir", filepath.Join(dir, "kubelet"),
		"--interval", "10s", "--clear-after", "10s"}
	if i == demoQuarantineSlot {
		args = append(args, "--fault", "xid:79@gpu3")
	}
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := nsCommand(ns, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the agent of slot %d: %v", i, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
}

// injectDemoFault asks a simulated agent, on its local socket, for a fault.
func injectDemoFault(t *testing.T, ctx context.Context, sock, spec string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := agentv1.NewAgentServiceClient(conn).InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: spec}}); err != nil {
		t.Fatalf("InjectFault %s on %s: %v", spec, sock, err)
	}
}

// machines is `gpuboot machines list -o json`, or nil while gpuboot does not answer.
func (g *namespacedGpuboot) machines(t *testing.T) []*bootv1.Machine {
	t.Helper()
	out, err := g.env.Run(g.ns, g.bin, "machines", "list", "-o", "json", "--server", joinTLS, "--credentials", g.creds)
	if err != nil {
		return nil
	}
	var r bootv1.ListMachinesResponse
	if err := protojson.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("gpuboot machines list -o json is not a ListMachinesResponse: %v\n%s", err, out)
	}
	return r.GetMachines()
}

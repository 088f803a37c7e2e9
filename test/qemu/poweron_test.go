//go:build linux

package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The power-on rig's boot network: a bridge in the test namespace that owns joinHost
// (so the control plane's endpoint and gpuboot's advertised address are the ones the
// JoinBundle and /boot.ipxe name, as in TestTinyNodeJoin), with QEMU's tap on it.
// gpuboot is the network's DHCP server (dhcp.mode: full) and reserves poweronNodeIP
// for the machine; dnsmasq only sends IPv6 router advertisements (without one iPXE
// spends about 16 s on IPv6 autoconfiguration, docs/pxe.md).
const (
	poweronNodeIP = "10.0.2.15"
	poweronPrefix = "/24"
	poweronRA     = "fd88::1/64"
	// poweronROM is iPXE as the virtio-net option ROM for SeaBIOS (Debian ipxe-qemu). Its
	// PCI header names the modern virtio-net (1af4:1041): QEMU patches the IDs of its
	// default ROM only, and SeaBIOS runs no ROM whose IDs differ from the device's, so
	// the NIC is modern-only (disable-legacy=on).
	poweronROM = "/usr/lib/ipxe/qemu/pxe-virtio.rom"
)

// TestPowerOnToNode powers on one diskless machine and follows it, with no shortcut,
// until it is a joined node: QEMU (TCG) starts SeaBIOS, whose virtio-net option ROM is
// iPXE; iPXE takes its address and boot script URL from the real `gpuboot serve` (full
// DHCP on the test's bridge), fetches /boot.ipxe with the machine's identity, then the
// kernel and initrd of the gpuimage-built tiny image from gpuboot's signed store;
// gpurack-init fetches and verifies the rootfs; systemd starts gpuagent, which
// registers and waits for approval; the test approves with `gpuboot machines approve`;
// the agent takes its JoinBundle and starts kubelet, which registers the Node; the
// agent reports commissioning and gpuboot shows the machine ready.
//
// It logs a timestamp per milestone as it sees it and the whole list at the end (also
// on failure), from gpuboot's log, the serial console, gpuboot's machine history and
// the Kubernetes API. GPURACK_E2E_LOGS=DIR keeps the serial console, gpuboot's log and
// the milestones there (make e2e sets it); a failure logs the tails of both anyway.
// GPURACK_JOIN_IMAGE reuses an image directory as in TestTinyNodeJoin.
func TestPowerOnToNode(t *testing.T) {
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	testreq.Tool(t, "dnsmasq", "apt-get install dnsmasq-base (make deps installs it)")
	testreq.File(t, poweronROM, "apt-get install ipxe-qemu (make deps installs it)")
	bins, imageDir, pubKey := joinImage(t)
	imageID := filepath.Base(imageDir)

	env, ns, br, tap := poweronNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	t.Cleanup(cancel)

	t0 := time.Now()
	cp := startNamespacedControlPlane(t, env, ns, bins.controlplane)
	admin := cp.clientset(t, ns)
	t.Logf("control plane up in the namespace in %s (endpoint https://%s)", time.Since(t0).Round(time.Millisecond), joinAPI)
	t.Cleanup(func() { // after QEMU is killed, before the control plane stops
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := admin.CoreV1().Nodes().Delete(ctx, joinNode, metav1.DeleteOptions{}); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete Node %s: %v", joinNode, err)
		}
	})

	g := startNamespacedGpuboot(t, env, ns, bins.gpuboot, cp.enroller, filepath.Dir(imageDir), pubKey, imageID, gpubootSettings{bootNet: poweronBootNet(br.Name), clusterDNS: clusterDNSAddress(t, ctx, admin)})

	startRouterAdverts(t, env, ns, br.Name)
	// Power on: no -kernel, the firmware boots from the network (bootindex=1).
	qemu := pxeQEMU(ns, tap.Name)
	con := startConsole(t, qemu)
	ms := watchPowerOn(t, con, g, imageID)

	// 1. DHCP, iPXE, the image, systemd, the agent: it registers and shows the wait, and
	// the key to approve, on the console.
	m := con.waitFor(t, regexp.MustCompile(`gpuagent: waiting for approval \(gpuboot `+regexp.QuoteMeta(joinTLS)+`, key (sha256:[0-9a-f]{64})\)`), bootToWaitLimit)
	consoleKey := m[1]
	bootToWait := con.since()
	t.Logf("power-on -> \"waiting for approval\" on the serial console: %s", bootToWait.Round(time.Second))
	ms.scan() // the network-boot milestones before the wait must all be in by now
	for _, want := range []string{msDHCP, msScript, msKernel, msInitrd, msRootfs, msVerified} {
		if _, ok := ms.at(want); !ok {
			t.Errorf("the machine said %q but no %q was seen: the boot went another way than DHCP, /boot.ipxe and gpuboot's image store", "waiting for approval", want)
		}
	}
	var mach *bootv1.Machine
	waitFor(t, ctx, time.Minute, "gpuboot records the registration", func() bool {
		mach = g.machine(t, joinMAC)
		return mach.GetState() == bootv1.MachineState_MACHINE_STATE_REGISTERED
	})
	if mach.GetKeyFingerprint() != consoleKey {
		t.Errorf("gpuboot holds key %s, the console showed %s: an operator comparing them would refuse", mach.GetKeyFingerprint(), consoleKey)
	}
	if id := mach.GetIdentity(); id.GetSerial() != joinSerial || id.GetSmbiosUuid() != joinUUID {
		t.Errorf("registered identity %v, want serial %s uuid %s (from the firmware through iPXE and the agent)", id, joinSerial, joinUUID)
	}
	if got := mach.GetFacts().GetImageId(); got != imageID {
		t.Errorf("registered facts say image %q, want %s", got, imageID)
	}
	if !slices.Contains(mach.GetFacts().GetIps(), poweronNodeIP) {
		t.Errorf("registered facts list addresses %v, want %s (gpuboot's DHCP reservation)", mach.GetFacts().GetIps(), poweronNodeIP)
	}

	// 2. Approval with the operator CLI; kubelet registers the Node.
	g.cli(t, "machines", "approve", joinMAC, "--reason", "TestPowerOnToNode", "--node-name", joinNode)
	ms.mark(msApproveCmd, "the test ran `gpuboot machines approve`")
	var node *corev1.Node
	getNode := func() *corev1.Node {
		n, err := admin.CoreV1().Nodes().Get(ctx, joinNode, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return n
	}
	waitFor(t, ctx, approveToNode, "kubelet in the guest registers Node "+joinNode, func() bool {
		node = getNode()
		return node != nil && node.Status.NodeInfo.KubeletVersion != ""
	})
	ms.record(msNode, node.CreationTimestamp.Time, "Kubernetes API: Node created")
	if v := node.Status.NodeInfo.KubeletVersion; v != joinKubelet {
		t.Errorf("Node %s: kubeletVersion %q, want %s (the image's kubelet)", joinNode, v, joinKubelet)
	}
	if !hasAddress(node, corev1.NodeInternalIP, poweronNodeIP) {
		t.Errorf("Node %s addresses %v: no InternalIP %s (the address gpuboot's DHCP gave the machine)", joinNode, node.Status.Addresses, poweronNodeIP)
	}

	// 3. Commissioning is reported, gpuboot moves the machine to ready and lifts the taint.
	waitFor(t, ctx, nodeToReady, "machine ready, gpurack.io/unvalidated removed, the agent's label on the Node", func() bool {
		node = getNode()
		mach = g.machine(t, joinMAC)
		if r := nodeCondition(node, corev1.NodeReady); node != nil && r != nil && r.Status == corev1.ConditionTrue {
			ms.record(msNodeReady, r.LastTransitionTime.Time, "Kubernetes API: Ready=True")
		}
		return node != nil && mach.GetState() == bootv1.MachineState_MACHINE_STATE_READY && !nodeHasTaint(node, "gpurack.io/unvalidated") &&
			node.Labels["gpurack.io/image"] == imageID
	}, func() string {
		return fmt.Sprintf("gpuboot: machine %s; Node present %t", mach.GetState(), node != nil)
	})
	ms.mark(msMachineReady, "gpuboot machines show: ready; the Node untainted")
	ms.history(mach)
	for _, want := range []string{msRegistered, msApproved, msBundle, msCommissioning, msReported} {
		if _, ok := ms.at(want); !ok {
			t.Errorf("gpuboot's history of the machine has no %q: %v", want, mach.GetHistory())
		}
	}
	if _, ok := ms.at(msSystemd); !ok {
		t.Errorf("the serial console never showed the boot report (%q)", "gpurack: booted image "+imageID)
	}

	// 4. Node Ready (the pod network up) and a pod Running.
	waitFor(t, ctx, nodeToReady, "Node "+joinNode+" Ready", func() bool {
		node = getNode()
		r := nodeCondition(node, corev1.NodeReady)
		if node != nil && r != nil && r.Status == corev1.ConditionTrue {
			ms.record(msNodeReady, r.LastTransitionTime.Time, "Kubernetes API: Ready=True")
			return true
		}
		return false
	})
	runFirstPod(t, ctx, admin, ms, joinNode)
	t.Logf("timings: power-on -> waiting for approval %s, power-on -> machine ready %s", bootToWait.Round(time.Second), con.since().Round(time.Second))
}

// poweronNetwork is the boot network: a namespace with a bridge that owns joinHost
// and the IPv6 prefix the router advertisements announce, and QEMU's tap on it.
func poweronNetwork(t *testing.T) (env *netnstest.Env, ns string, br, tap netnstest.Link) {
	t.Helper()
	env = netnstest.New(t)
	ns = env.Namespace()
	br, tap = env.Bridge(ns), env.Tap(ns)
	env.Attach(br, tap)
	env.AddAddr(br, joinHost+poweronPrefix)
	env.AddAddr(br, poweronRA)
	return env, ns, br, tap
}

// poweronBootNet is gpuboot's boot network on bridge: full DHCP with a reservation of
// poweronNodeIP for the test machine (joinMAC), and TFTP.
func poweronBootNet(bridge string) string {
	return fmt.Sprintf(`interfaces: [{name: %s}]
dhcp:
  mode: full
  pool: {start: 10.0.2.100, end: 10.0.2.199, netmask: 255.255.255.0, routers: [%s], leaseTime: 1h}
  reservations: [{mac: "%s", ip: %s}]
tftp: {enabled: true}`, bridge, joinHost, joinMAC, poweronNodeIP)
}

// startRouterAdverts runs dnsmasq on the boot bridge for IPv6 router advertisements
// only (gpuboot is the DHCP server): without one iPXE spends about 16 s on IPv6
// autoconfiguration (docs/pxe.md).
func startRouterAdverts(t *testing.T, env *netnstest.Env, ns, bridge string) {
	t.Helper()
	ra := env.Command(ns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--user=root", "--port=0",
		"--bind-interfaces", "--interface="+bridge, "--log-facility=-", "--no-resolv", "--no-hosts",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"), "--pid-file=",
		"--enable-ra", "--dhcp-range=fd88::,ra-only")
	if err := ra.Start(); err != nil {
		t.Fatalf("start dnsmasq (router advertisements): %v", err)
	}
	go ra.Wait()
}

// pxeQEMU is the diskless test machine (joinMAC, joinSerial, joinUUID) on tap in ns:
// no -kernel, SeaBIOS boots from the network (bootindex=1) through the iPXE ROM.
func pxeQEMU(ns, tap string) *exec.Cmd {
	return nsCommand(ns, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-m", "2048", "-smp", "2",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot", "-boot", "n",
		"-smbios", "type=1,serial="+joinSerial+",uuid="+joinUUID,
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+joinMAC+",disable-legacy=on,romfile="+poweronROM+",bootindex=1",
		"-device", "virtio-rng-pci")
}

// runFirstPod schedules a pod of the image's preloaded pause image (no registry is
// reachable) and waits for it to run on the node.
func runFirstPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, ms *powerOnMilestones, nodeName string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "first-pod", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: nodeName},
			Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10.1",
				ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	waitFor(t, ctx, nodeToReady, "pod first-pod Running on "+nodeName, func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		got = p
		return err == nil && p.Status.Phase == corev1.PodRunning
	}, func() string {
		if got == nil {
			return "no pod"
		}
		return fmt.Sprintf("pod on %q: phase %s, conditions %v", got.Spec.NodeName, got.Status.Phase, got.Status.Conditions)
	})
	at := time.Now()
	for _, c := range got.Status.ContainerStatuses {
		if c.State.Running != nil {
			at = c.State.Running.StartedAt.Time
		}
	}
	ms.record(msPod, at, "Kubernetes API: container running")
}

// The milestones of a power-on, in their usual order (the table sorts them by time).
const (
	msDHCP          = "DHCP offer to iPXE"
	msScript        = "iPXE script for the machine"
	msKernel        = "kernel fetched"
	msInitrd        = "initrd fetched"
	msLease         = "initramfs DHCP lease"
	msRootfs        = "rootfs fetched"
	msVerified      = "rootfs verified"
	msSwitchRoot    = "systemd started"
	msRegistered    = "agent registered"
	msWaiting       = "waiting for approval on the console"
	msSystemd       = "systemd up (boot report)"
	msApproveCmd    = "approve command run"
	msApproved      = "approved"
	msBundle        = "JoinBundle released"
	msNode          = "Node registered"
	msCommissioning = "commissioning started"
	msReported      = "commissioning reported"
	msNodeReady     = "Node Ready"
	msMachineReady  = "machine ready"
	msPod           = "first pod Running"
)

var msOrder = []string{msDHCP, msScript, msKernel, msInitrd, msLease, msRootfs, msVerified, msSwitchRoot,
	msRegistered, msWaiting, msSystemd, msApproveCmd, msApproved, msBundle, msNode, msCommissioning,
	msReported, msNodeReady, msMachineReady, msPod}

// powerOnMilestones records when each milestone was first seen, relative to power-on
// (QEMU's start), and logs them.
type powerOnMilestones struct {
	t       *testing.T
	start   time.Time
	con     *serialConsole
	g       *namespacedGpuboot
	logPats []milestonePattern // matched against gpuboot's log lines
	conPats []milestonePattern // matched against the serial console

	mu   sync.Mutex
	seen map[string]milestoneSeen

	scanMu  sync.Mutex // one scan at a time
	logOff  int        // bytes of gpuboot's log scanned
	conSeen int        // console lines scanned
	stop    chan struct{}
	done    chan struct{}
}

type milestonePattern struct {
	name string
	re   *regexp.Regexp
}

type milestoneSeen struct {
	at   time.Time
	from string
}

// slogTime is the time= field of gpuboot's log lines (slog's text handler).
var slogTime = regexp.MustCompile(`^time=(\S+) `)

// watchPowerOn follows gpuboot's log and the console until the test ends, then logs the
// milestones and keeps the logs (GPURACK_E2E_LOGS).
func watchPowerOn(t *testing.T, con *serialConsole, g *namespacedGpuboot, imageID string) *powerOnMilestones {
	mac := regexp.QuoteMeta(joinMAC)
	img := `msg="images: sent" image=` + imageID + ` file=`
	ms := &powerOnMilestones{t: t, start: con.start, con: con, g: g, seen: map[string]milestoneSeen{},
		stop: make(chan struct{}), done: make(chan struct{}),
		logPats: []milestonePattern{
			{msDHCP, regexp.MustCompile(`msg="dhcp: reply" type=OFFER mac=` + mac + ` client=ipxe `)},
			{msScript, regexp.MustCompile(`msg="boot.ipxe: boot" identity="?` + mac + `\|`)},
			{msKernel, regexp.MustCompile(img + `vmlinuz to=` + poweronNodeIP + ` `)},
			{msInitrd, regexp.MustCompile(img + `initrd.img to=` + poweronNodeIP + ` `)},
			{msRootfs, regexp.MustCompile(img + `rootfs.squashfs to=` + poweronNodeIP + ` `)},
		},
		conPats: []milestonePattern{
			{msLease, regexp.MustCompile(`DHCP lease ` + poweronNodeIP + `/24`)},
			{msVerified, regexp.MustCompile(`rootfs sha256 [0-9a-f]{64} verified`)},
			{msSwitchRoot, regexp.MustCompile(`switch_root: exec `)},
			{msWaiting, regexp.MustCompile(`gpuagent: waiting for approval`)},
			{msSystemd, regexp.MustCompile(`gpurack: booted image ` + imageID + ` .*gpuagent\.service=active`)},
		}}
	go func() {
		defer close(ms.done)
		for {
			select {
			case <-ms.stop:
				return
			case <-time.After(100 * time.Millisecond):
				ms.scan()
			}
		}
	}()
	logs := os.Getenv("GPURACK_E2E_LOGS")
	t.Cleanup(func() { // before QEMU and gpuboot stop: their logs so far
		close(ms.stop)
		<-ms.done
		ms.scan()
		table := ms.table()
		t.Logf("power-on milestones (0 = QEMU started at %s):\n%s", ms.start.UTC().Format("15:04:05.000"), table)
		if logs == "" {
			return
		}
		dir := filepath.Join(logs, t.Name())
		serial, err := os.ReadFile(con.logPath)
		if err == nil {
			err = os.MkdirAll(dir, 0o755)
		}
		for name, data := range map[string][]byte{"serial.log": serial, "gpuboot.log": []byte(g.log.String()), "milestones.txt": []byte(table)} {
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name), data, 0o644)
			}
		}
		if err != nil {
			t.Errorf("keep the logs in GPURACK_E2E_LOGS: %v", err)
			return
		}
		t.Logf("serial console, gpuboot log and milestones kept in %s", dir)
	})
	return ms
}

// scan matches the log and console lines that arrived since the last scan.
func (ms *powerOnMilestones) scan() {
	ms.scanMu.Lock()
	defer ms.scanMu.Unlock()
	now := time.Now()
	ms.con.mu.Lock()
	lines := slices.Clone(ms.con.lines[ms.conSeen:])
	ms.con.mu.Unlock()
	ms.conSeen += len(lines)
	newLog := ms.g.log.String()[ms.logOff:]
	newLog = newLog[:strings.LastIndexByte(newLog, '\n')+1] // whole lines only
	ms.logOff += len(newLog)

	for line := range strings.SplitSeq(newLog, "\n") {
		for _, p := range ms.logPats {
			if p.re.MatchString(line) {
				at := now
				if m := slogTime.FindStringSubmatch(line); m != nil {
					if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
						at = t
					}
				}
				ms.record(p.name, at, "gpuboot log")
			}
		}
	}
	for _, line := range lines {
		for _, p := range ms.conPats {
			if p.re.MatchString(line) {
				ms.record(p.name, now, "serial console")
			}
		}
	}
}

// history records the lifecycle transitions from gpuboot's machine record.
func (ms *powerOnMilestones) history(m *bootv1.Machine) {
	names := map[bootv1.MachineState]string{
		bootv1.MachineState_MACHINE_STATE_REGISTERED:    msRegistered,
		bootv1.MachineState_MACHINE_STATE_APPROVED:      msApproved,
		bootv1.MachineState_MACHINE_STATE_JOINING:       msBundle,
		bootv1.MachineState_MACHINE_STATE_COMMISSIONING: msCommissioning,
		bootv1.MachineState_MACHINE_STATE_READY:         msReported,
	}
	for _, tr := range m.GetHistory() {
		if name, ok := names[tr.GetTo()]; ok {
			ms.record(name, tr.GetTime().AsTime(), "gpuboot history: "+strings.ToLower(strings.TrimPrefix(tr.GetTo().String(), "MACHINE_STATE_")))
		}
	}
}

// mark records name as happening now.
func (ms *powerOnMilestones) mark(name, from string) { ms.record(name, time.Now(), from) }

// record keeps the first time name was seen and logs it.
func (ms *powerOnMilestones) record(name string, at time.Time, from string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if _, ok := ms.seen[name]; ok {
		return
	}
	ms.seen[name] = milestoneSeen{at: at, from: from}
	ms.t.Logf("milestone %7.1fs %s (%s)", at.Sub(ms.start).Seconds(), name, from)
}

func (ms *powerOnMilestones) at(name string) (time.Duration, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s, ok := ms.seen[name]
	return s.at.Sub(ms.start), ok
}

// table lists the milestones seen in the order they happened, with the time since
// power-on, the time since the one before and where each was seen, then those not
// reached.
func (ms *powerOnMilestones) table() string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	names := slices.Clone(msOrder)
	slices.SortStableFunc(names, func(a, b string) int {
		sa, oka := ms.seen[a]
		sb, okb := ms.seen[b]
		switch {
		case oka && okb:
			return sa.at.Compare(sb.at)
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
	var b strings.Builder
	prev := ms.start
	for _, name := range names {
		s, ok := ms.seen[name]
		if !ok {
			fmt.Fprintf(&b, "  %8s  %7s  %-36s not reached\n", "-", "", name)
			continue
		}
		fmt.Fprintf(&b, "  %7.1fs  %+6.1fs  %-36s %s  %s\n", s.at.Sub(ms.start).Seconds(), s.at.Sub(prev).Seconds(), name,
			s.at.UTC().Format("15:04:05.000"), s.from)
		prev = s.at
	}
	return b.String()
}

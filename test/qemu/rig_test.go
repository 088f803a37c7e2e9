//go:build linux

package qemu

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/swtpmtest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
	"github.com/gpurack/gpurack/test/rigimage"
)

// The rig: one boot network in a network namespace the test makes, with the control
// plane, gpuboot and QEMU machines on it. The namespace's bridge owns joinHost, so the
// control plane's endpoint and gpuboot's advertised address are the ones the
// JoinBundle and /boot.ipxe name, as on a real rack; each machine's NIC is a tap on
// that bridge, and gpuboot is the network's DHCP server (dhcp.mode: full) with a
// reservation per machine.
const (
	joinHost    = "10.0.2.2"
	joinAPI     = joinHost + ":6443"
	joinHTTP    = joinHost + ":8080"
	joinTLS     = joinHost + ":8443"
	joinKubelet = "v1.34.2" // what `make k8s-bins` pins and gpuimage ships

	// The first machine's identity (a machine of the rack, or the one machine of the
	// TPM and rack-demo tests).
	joinMAC    = "52:54:00:e2:e0:10"
	joinSerial = "GPR-JOIN-0001"
	joinUUID   = "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e10"
	joinNode   = "gpu-r1-qemu"

	poweronNodeIP = "10.0.2.15" // gpuboot's reservation for joinMAC
	poweronPrefix = "/24"
	// poweronRA is the IPv6 prefix dnsmasq advertises on the bridge: without a router
	// advertisement iPXE spends about 16 s on IPv6 autoconfiguration (docs/pxe.md).
	poweronRA = "fd88::1/64"
	// poweronROM is iPXE as the virtio-net option ROM for SeaBIOS (Debian ipxe-qemu). Its
	// PCI header names the modern virtio-net (1af4:1041): QEMU patches the IDs of its
	// default ROM only, and SeaBIOS runs no ROM whose IDs differ from the device's, so
	// the NIC is modern-only (disable-legacy=on).
	poweronROM = "/usr/lib/ipxe/qemu/pxe-virtio.rom"
)

// journalHint says how to see more of the guest after a failure.
const journalHint = "(GPURACK_JOIN_JOURNAL=1 puts the guest's journal on the serial console)"

// Generous guards for a loaded 2-core host under TCG, not performance assertions.
const (
	bootToWaitLimit = 8 * time.Minute
	approveToNode   = 6 * time.Minute
	nodeToReady     = 3 * time.Minute
)

// The images a rack machine boots: the tiny image, and its simulated GPU variant
// (test/rigimage builds them).
const (
	imageTiny   = rigimage.Tiny
	imageSimGPU = rigimage.SimGPU
	// imageSimGPUNext is the same profile under another name, so another image id: the
	// image a rollout moves a simulated GPU machine to.
	imageSimGPUNext = rigimage.SimGPUNext
)

// MachineSpec is one machine of a rack.
type MachineSpec struct {
	Node, MAC, IP, Serial, UUID string
	// Image is imageTiny (the default) or imageSimGPU; gpuboot gives it to the machine
	// through a selector on its MAC.
	Image string
	// PXE powers the machine on through its firmware: SeaBIOS runs the iPXE option ROM,
	// which takes its address and boot script from gpuboot's DHCP and fetches /boot.ipxe,
	// the kernel and the initrd. Otherwise QEMU boots the kernel and initrd that
	// gpuboot's /boot.ipxe names for the machine (-kernel), with the same command line.
	PXE bool
	// TPMDir, when set, gives the machine a TPM 2.0: swtpm on that state folder (the
	// same folder is the same TPM), as a tpm-tis device.
	TPMDir string
	// Disks are local disks (the nodes boot diskless either way): virtio block devices
	// in this order, /dev/vda, /dev/vdb, … in the guest.
	Disks []QEMUDisk
	// BMC gives the machine a Redfish BMC (pxe/bmc/redfishtest) in the rack's network
	// namespace, named in the rack manifest's bmc column: its power actions stop and
	// start the machine's QEMU (Rack.bmcReset).
	BMC bool
	// Memory is the machine's memory in MiB (default 2048, as every node of TestRack).
	Memory int
	// CPU is QEMU's CPU model (-cpu; default QEMU's qemu64, which has no SSE4 or AVX):
	// "max" is every feature TCG emulates, for software built for today's servers.
	CPU string
}

// QEMUDisk is one virtio disk of a machine: an image file (qcow2 or raw) and the serial
// the guest reads in sysfs.
type QEMUDisk struct {
	File, Format, Serial string
}

// RackOptions is what startRack sets up.
type RackOptions struct {
	Machines []MachineSpec
	// PodNetwork is the flannel backend in gpuboot's cluster.podNetwork (default vxlan).
	PodNetwork string
	// NoControlPlane runs gpuboot without a cluster (its bundles carry no Kubernetes
	// credentials): for tests of enrollment alone.
	NoControlPlane bool
	// Enrollment and Policy replace gpuboot's enrollment and policy settings (flow
	// YAML); allowSimulated is added when a machine boots the simulated GPU image.
	Enrollment, Policy string
	// NoPowerOn sets the rack up for Machines (gpuboot's reservations and selectors)
	// but powers none on: the test does, with Rack.powerOn. Otherwise startRack powers
	// every machine on, approves each when its agent waits, and returns when every
	// Node is Ready.
	NoPowerOn bool
	// Name is the approval reason (default: the test's name).
	Name string
	// ExtraImages are put in gpuboot's image store beside those the machines boot
	// (e.g. imageSimGPUNext, for a rollout).
	ExtraImages []string
}

// Rack is a running rack: the namespace, the control plane, gpuboot and the machines.
type Rack struct {
	env    *netnstest.Env
	ns     string
	bridge netnstest.Link
	bins   joinBinaries
	images rackImages
	cp     *namespacedControlPlane // nil with NoControlPlane
	// alerts receives every alert of the control plane's Alertmanager (metrics_test.go).
	alerts *alertHook
	admin  kubernetes.Interface
	g      *namespacedGpuboot
	ctx    context.Context
	opts   RackOptions

	Machines []*RackMachine
	// bmcs are the machines' Redfish BMCs by node name (MachineSpec.BMC); powered
	// receives each machine a BMC powers on (Rack.bmcReset), and mu guards Machines
	// while a BMC replaces one.
	bmcs    map[string]*redfishtest.Server
	powered chan *RackMachine
	mu      sync.Mutex
}

// RackMachine is one powered-on machine of a rack.
type RackMachine struct {
	MachineSpec
	imageID string
	con     *serialConsole
	// ms follows a PXE machine's power-on milestones (nil for a direct boot).
	ms   *powerOnMilestones
	qemu *exec.Cmd
	tpm  *swtpmtest.QEMUTPM
	// What the join saw.
	key                 string // the agent's key, as the console showed it
	node                *corev1.Node
	bootToWait, toReady time.Duration
	approved            time.Time
}

// startRack sets up a rack as opts says: the boot network, the control plane, gpuboot
// (full DHCP with a reservation per machine, the images each machine boots, the pod
// network), every machine powered on at once, as a rack is; then, unless NoPowerOn, the
// approval of each and the wait for each Node to be Ready (rack.join). Everything
// stops when t ends.
func startRack(t *testing.T, opts RackOptions) *Rack {
	t.Helper()
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	testreq.Tool(t, "dnsmasq", "apt-get install dnsmasq-base (make deps installs it)")
	pxe := slices.ContainsFunc(opts.Machines, func(m MachineSpec) bool { return m.PXE })
	if pxe {
		testreq.File(t, poweronROM, "apt-get install ipxe-qemu (make deps installs it)")
	}
	var names []string
	for i := range opts.Machines {
		m := &opts.Machines[i]
		m.Image = cmp.Or(m.Image, imageTiny)
		if !slices.Contains(names, m.Image) {
			names = append(names, m.Image)
		}
	}
	for _, n := range opts.ExtraImages {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	r := &Rack{opts: opts}
	r.bins = rigBinaries(t)
	r.images = imageStore(t, r.bins, names...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	t.Cleanup(cancel)
	r.ctx = ctx
	r.env = netnstest.New(t)
	r.ns = r.env.Namespace()
	r.bridge = r.env.Bridge(r.ns)
	r.env.AddAddr(r.bridge, joinHost+poweronPrefix)
	r.env.AddAddr(r.bridge, poweronRA)

	set := gpubootSettings{podNetwork: "{backend: " + cmp.Or(opts.PodNetwork, "vxlan") + "}",
		enrollment: cmp.Or(opts.Enrollment, "{unknownMachines: discover}"), policy: opts.Policy}
	enroller := ""
	if !opts.NoControlPlane {
		t0 := time.Now()
		r.alerts = startAlertHook(t, r.ns)
		// The image registry and its token issuer (registry.enabled) on the advertise
		// address; gpuboot names it to the nodes (cluster.registry). Kueue, the
		// tenants' job queues (queues.enabled). gpurack-shared on machine A's export,
		// which TestRack's shared-volume checks serve there (storage.nfs).
		r.cp = startNamespacedControlPlane(t, r.env, r.ns, r.bins.controlplane, monitoringConfig(t, r.alerts)+"registry: {enabled: true}\nqueues: {enabled: true}\n"+
			"storage: {nfs: {server: "+poweronNodeIP+", share: "+sharedShare+"}}\n")
		r.admin = r.cp.clientset(t, r.ns)
		enroller = r.cp.enroller
		set.logsEndpoint = joinHost + ":9428" // monitoring.logs' gateway, on by default with monitoring
		set.registry = rackRegistry
		t.Logf("control plane up in the namespace in %s (endpoint https://%s)", time.Since(t0).Round(time.Millisecond), joinAPI)
		// Registered before QEMU starts, so it runs after QEMU is killed (a live kubelet
		// would register the Node again) and before the control plane stops.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, m := range opts.Machines {
				if err := r.admin.CoreV1().Nodes().Delete(ctx, m.Node, metav1.DeleteOptions{}); err != nil && !strings.Contains(err.Error(), "not found") {
					t.Errorf("delete Node %s: %v", m.Node, err)
				}
			}
		})
	}
	var reservations, selectors []string
	for _, m := range opts.Machines {
		reservations = append(reservations, fmt.Sprintf(`{mac: "%s", ip: %s}`, m.MAC, m.IP))
		if m.Image != imageTiny {
			selectors = append(selectors, fmt.Sprintf(`{name: %s, match: {machine: "%s"}, image: %s}`, m.Node, m.MAC, r.images.ids[m.Image]))
		}
		if m.Image == imageSimGPU && !strings.Contains(set.enrollment, "allowSimulated") {
			set.enrollment = strings.TrimSuffix(set.enrollment, "}") + ", allowSimulated: true}"
		}
	}
	set.selectors = "[" + strings.Join(selectors, ", ") + "]"
	set.bootNet = fmt.Sprintf(`interfaces: [{name: %s}]
dhcp:
  mode: full
  pool: {start: 10.0.2.100, end: 10.0.2.199, netmask: 255.255.255.0, routers: [%[2]s], dns: [%[2]s], leaseTime: 1h}
  reservations: [%[3]s]
tftp: {enabled: %[4]t}`, r.bridge.Name, joinHost, strings.Join(reservations, ", "), pxe)
	startSiteServices(t, r.env, r.ns, r.bridge.Name)
	r.startBMCs(t, &set)
	r.g = startNamespacedGpuboot(t, r.env, r.ns, r.bins.gpuboot, enroller, r.images.store, r.images.pubKeys, r.images.ids[imageTiny], set)
	if opts.NoPowerOn {
		return r
	}
	for _, spec := range opts.Machines {
		r.Machines = append(r.Machines, r.powerOn(t, spec))
	}
	r.join(t)
	return r
}

// powerOn starts QEMU for spec, its NIC a new tap on the rack's bridge.
func (r *Rack) powerOn(t *testing.T, spec MachineSpec) *RackMachine {
	t.Helper()
	spec.Image = cmp.Or(spec.Image, imageTiny)
	m := &RackMachine{MachineSpec: spec, imageID: r.images.ids[spec.Image]}
	tap := r.env.Tap(r.ns)
	r.env.Attach(r.bridge, tap)
	q := qemuMachine{Name: spec.Node, MAC: spec.MAC, Serial: spec.Serial, UUID: spec.UUID, Tap: tap.Name, PXE: spec.PXE, Disks: spec.Disks, Memory: spec.Memory, CPU: spec.CPU}
	if !spec.PXE {
		q.Kernel, q.Initrd, q.Cmdline = r.g.bootScriptFor(t, r.ctx, spec.MAC, spec.UUID, spec.Serial)
		q.Cmdline += " gpurack.onfail=poweroff"
		if os.Getenv("GPURACK_JOIN_JOURNAL") == "1" {
			// The guest's whole journal on the serial console: slow, for debugging.
			q.Cmdline += " systemd.journald.forward_to_console=1"
		}
		for _, want := range []string{"gpurack.rootfs=http://" + joinHTTP + "/images/" + m.imageID + "/rootfs.squashfs",
			"BOOTIF=01-" + strings.ReplaceAll(spec.MAC, ":", "-"), "gpurack.enroll=" + joinTLS, "gpurack.enroll.ca=" + r.g.pin} {
			if !strings.Contains(q.Cmdline, want) {
				t.Errorf("gpuboot's kernel command line for %s lacks %q: %s", spec.Node, want, q.Cmdline)
			}
		}
	}
	if spec.TPMDir != "" {
		m.tpm = swtpmtest.StartForQEMU(t, spec.TPMDir)
		q.TPMSocket = m.tpm.Socket
	}
	m.qemu = nsCommand(r.ns, "qemu-system-x86_64", qemuArgs(q)...)
	m.con = startNamedConsole(t, m.qemu, spec.Node)
	if spec.PXE {
		m.ms = watchPowerOn(t, m.con, r.g, m.imageID, spec.MAC, spec.IP)
	}
	t.Logf("%s powered on (%s, image %s, %s)", spec.Node, map[bool]string{true: "PXE through the firmware", false: "kernel and initrd from gpuboot's boot script"}[spec.PXE], m.imageID, spec.MAC)
	return m
}

// powerOff kills the machine's QEMU and its TPM, as pulling the plug does.
func (m *RackMachine) powerOff() {
	m.qemu.Process.Kill()
	<-m.con.done
	if m.tpm != nil {
		m.tpm.Stop()
	}
}

// waitingLine is the console line of an agent that registered and waits for approval.
var waitingLine = regexp.MustCompile(`gpuagent: waiting for approval \(gpuboot ` + regexp.QuoteMeta(joinTLS) + `, key (sha256:[0-9a-f]{64})\)`)

// join takes every machine from power-on to a Ready Node, checking each step: the
// agent registers and shows its key on the console, and gpuboot holds that key, the
// machine's identity, its image and its address; `gpuboot machines approve`; kubelet
// (the image's) registers the Node under the name the agent set, with the machine's
// address; gpuboot moves the machine to ready and lifts gpurack.io/unvalidated; the
// pod network brings the Node to Ready, and kube-proxy has its rules in place.
func (r *Rack) join(t *testing.T) {
	t.Helper()
	reason := cmp.Or(r.opts.Name, t.Name())
	for _, m := range r.Machines {
		r.awaitRegistered(t, m)
		m.approved = time.Now()
		r.g.cli(t, "machines", "approve", m.MAC, "--reason", reason, "--node-name", m.Node)
		if m.ms != nil {
			m.ms.mark(msApproveCmd, "the test ran `gpuboot machines approve`")
		}
	}
	for _, m := range r.Machines {
		r.awaitReady(t, m)
	}
}

// awaitRegistered waits for m's agent to register and wait for approval, and checks
// what gpuboot recorded against what the console showed.
func (r *Rack) awaitRegistered(t *testing.T, m *RackMachine) {
	t.Helper()
	m.key = m.con.waitFor(t, waitingLine, bootToWaitLimit)[1]
	m.bootToWait = m.con.since()
	t.Logf("%s: power-on -> \"waiting for approval\" on the serial console: %s", m.Node, m.bootToWait.Round(time.Second))
	if m.ms != nil {
		m.ms.scan() // the network-boot milestones before the wait must all be in by now
		for _, want := range []string{msDHCP, msScript, msKernel, msInitrd, msRootfs, msVerified} {
			if _, ok := m.ms.at(want); !ok {
				t.Errorf("%s said %q but no %q was seen: the boot went another way than DHCP, /boot.ipxe and gpuboot's image store", m.Node, "waiting for approval", want)
			}
		}
	}
	var mach *bootv1.Machine
	waitFor(t, r.ctx, time.Minute, "gpuboot records "+m.Node+"'s registration", func() bool {
		mach = r.g.machine(t, m.MAC)
		return mach.GetState() == bootv1.MachineState_MACHINE_STATE_REGISTERED
	})
	if mach.GetKeyFingerprint() != m.key {
		t.Errorf("%s: gpuboot holds key %s, the console showed %s: an operator comparing them would refuse", m.Node, mach.GetKeyFingerprint(), m.key)
	}
	if id := mach.GetIdentity(); id.GetSerial() != m.Serial || id.GetSmbiosUuid() != m.UUID {
		t.Errorf("%s: registered identity %v, want serial %s uuid %s (QEMU -smbios type=1)", m.Node, id, m.Serial, m.UUID)
	}
	if got := mach.GetFacts().GetImageId(); got != m.imageID {
		t.Errorf("%s: registered facts say image %q, want %s", m.Node, got, m.imageID)
	}
	if !slices.Contains(mach.GetFacts().GetIps(), m.IP) {
		t.Errorf("%s: registered facts list addresses %v, want %s (gpuboot's DHCP reservation)", m.Node, mach.GetFacts().GetIps(), m.IP)
	}
}

// awaitReady waits for m's Node, the machine ready in gpuboot, and the Node Ready.
func (r *Rack) awaitReady(t *testing.T, m *RackMachine) {
	t.Helper()
	var node *corev1.Node
	getNode := func() *corev1.Node {
		n, err := r.admin.CoreV1().Nodes().Get(r.ctx, m.Node, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return n
	}
	waitFor(t, r.ctx, approveToNode, "kubelet on "+m.Node+" registers its Node", func() bool {
		node = getNode()
		return node != nil && node.Status.NodeInfo.KubeletVersion != ""
	}, r.nodeNames, m.con.tail)
	t.Logf("%s: approve -> Node registered by kubelet %s: %s", m.Node, node.Status.NodeInfo.KubeletVersion, time.Since(m.approved).Round(time.Second))
	if m.ms != nil {
		m.ms.record(msNode, node.CreationTimestamp.Time, "Kubernetes API: Node created")
	}
	if v := node.Status.NodeInfo.KubeletVersion; v != joinKubelet {
		t.Errorf("Node %s: kubeletVersion %q, want %s (the image's kubelet)", m.Node, v, joinKubelet)
	}
	// kubelet names the Node, its Hostname address and its kubernetes.io/hostname label
	// after the kernel's hostname: the transient hostname the agent set through
	// hostname1 (the image boots as "gpurack", its fallback hostname).
	if !hasAddress(node, corev1.NodeHostName, m.Node) || node.Labels[corev1.LabelHostname] != m.Node {
		t.Errorf("Node %s: addresses %v, label %s=%q: the guest's hostname is not the node name", m.Node, node.Status.Addresses, corev1.LabelHostname, node.Labels[corev1.LabelHostname])
	}
	if !hasAddress(node, corev1.NodeInternalIP, m.IP) {
		t.Errorf("Node %s addresses %v: no InternalIP %s (the address gpuboot's DHCP gave the machine)", m.Node, node.Status.Addresses, m.IP)
	}
	if !strings.Contains(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("Node %s container runtime %q, want the image's containerd", m.Node, node.Status.NodeInfo.ContainerRuntimeVersion)
	}

	// The agent picks up kubelet's node credentials (its label on the Node), reports
	// commissioning, and gpuboot moves the machine to ready and lifts the taint.
	var mach *bootv1.Machine
	waitFor(t, r.ctx, nodeToReady, m.Node+": machine ready, gpurack.io/unvalidated removed, the agent's label and GPUHealthy on the Node", func() bool {
		node = getNode()
		mach = r.g.machine(t, m.MAC)
		if rd := nodeCondition(node, corev1.NodeReady); m.ms != nil && node != nil && rd != nil && rd.Status == corev1.ConditionTrue {
			m.ms.record(msNodeReady, rd.LastTransitionTime.Time, "Kubernetes API: Ready=True")
		}
		return node != nil && mach.GetState() == bootv1.MachineState_MACHINE_STATE_READY && !nodeHasTaint(node, "gpurack.io/unvalidated") &&
			node.Labels["gpurack.io/image"] == m.imageID && nodeCondition(node, "GPUHealthy") != nil
	}, func() string {
		if node == nil {
			return fmt.Sprintf("gpuboot: machine %s; Node %s gone", mach.GetState(), m.Node)
		}
		return fmt.Sprintf("gpuboot: machine %s; Node taints %v, labels %v", mach.GetState(), node.Spec.Taints, node.Labels)
	})
	if m.ms != nil {
		m.ms.mark(msMachineReady, "gpuboot machines show: ready; the Node untainted")
		m.ms.history(mach)
	}
	t.Logf("%s: approve -> machine ready and gpurack.io/unvalidated removed: %s", m.Node, time.Since(m.approved).Round(time.Second))
	if mach.GetNodeName() != m.Node {
		t.Errorf("gpuboot machine node name %q, want %s", mach.GetNodeName(), m.Node)
	}
	var path []string
	for _, tr := range mach.GetHistory() {
		path = append(path, strings.ToLower(strings.TrimPrefix(tr.GetTo().String(), "MACHINE_STATE_")))
	}
	if want := []string{"approved", "joining", "commissioning", "ready"}; !containsInOrder(path, want) {
		t.Errorf("%s: gpuboot history %v lacks %v in order", m.Node, path, want)
	}
	if c := nodeCondition(node, "GPUHealthy"); c != nil {
		t.Logf("Node %s: GPUHealthy=%s (%s), labels %v", m.Node, c.Status, c.Reason, node.Labels)
	}
	// The pod network (gpuagent's agent/podnet: podCIDR, flannel, the conflist) makes
	// kubelet report Ready.
	waitFor(t, r.ctx, nodeToReady, "Node "+m.Node+" Ready=True (the pod network up)", func() bool {
		node = getNode()
		rd := nodeCondition(node, corev1.NodeReady)
		if m.ms != nil && rd != nil && rd.Status == corev1.ConditionTrue {
			m.ms.record(msNodeReady, rd.LastTransitionTime.Time, "Kubernetes API: Ready=True")
		}
		return rd != nil && rd.Status == corev1.ConditionTrue
	}, func() string {
		if rd := nodeCondition(node, corev1.NodeReady); rd != nil {
			return fmt.Sprintf("Ready=%s (%s: %s)", rd.Status, rd.Reason, rd.Message)
		}
		return "no Ready condition"
	}, m.con.tail)
	m.node = node
	m.toReady = time.Since(m.approved)
	t.Logf("Node %s: Ready=True, podCIDR %s (approve -> Ready %s)", m.Node, node.Spec.PodCIDR, m.toReady.Round(time.Second))
	log := m.con.text()
	// The backend the node runs is the bundle's (gpuboot's cluster.podNetwork), not the
	// image's default.
	if want := "starting flannel (" + cmp.Or(r.opts.PodNetwork, "vxlan") + ")"; !strings.Contains(log, want) {
		t.Errorf("%s's console lacks %q: the JoinBundle's backend was not used", m.Node, want)
	}
	// Ready waits for kube-proxy's rules (the pod network writes the conflist after),
	// and kube-proxy has turned liberal TCP conntrack on (without it, a held connection
	// was now and then reset at the restarts: kubernetes#74839).
	if want := "gpuagent: kube-proxy: Service rules in place; TCP conntrack liberal"; !strings.Contains(log, want) {
		t.Errorf("Node %s is Ready but its console lacks %q", m.Node, want)
	}
	if bootLine := regexp.MustCompile(`gpurack: booted image ` + m.imageID + ` .*gpuagent\.service=active`); !bootLine.MatchString(log) {
		t.Errorf("%s's serial console lacks %q", m.Node, bootLine)
	}
}

// nodeNames lists the cluster's Nodes, for a failure message.
func (r *Rack) nodeNames() string {
	var names []string
	if l, err := r.admin.CoreV1().Nodes().List(r.ctx, metav1.ListOptions{}); err == nil {
		for _, n := range l.Items {
			names = append(names, n.Name)
		}
	}
	return fmt.Sprintf("Nodes in the cluster: %v (kubelet names the Node after the guest's hostname)", names)
}

// qemuMachine is what qemuArgs needs to know of a machine.
type qemuMachine struct {
	Name, MAC, Serial, UUID string
	// Tap is the machine's NIC: a tap on the rack's bridge.
	Tap string
	// PXE boots through the firmware (no -kernel): SeaBIOS runs the iPXE ROM
	// (bootindex=1). Otherwise Kernel, Initrd and Cmdline are booted directly.
	PXE                     bool
	Kernel, Initrd, Cmdline string
	// TPMSocket is swtpm's control socket (swtpmtest.StartForQEMU): a tpm-tis device.
	TPMSocket string
	// Disks are virtio block devices.
	Disks []QEMUDisk
	// Memory is in MiB; 0 is 2048.
	Memory int
	// CPU is the -cpu model, or "" for QEMU's default.
	CPU string
}

// qemuArgs is the one QEMU command line of the rig: TCG on 2 vCPUs and 2 GiB (as
// every node of TestRack; qemuMachine.Memory gives more), no display, the serial console on stdout, no reboot
// (a guest that gives up powers off: gpurack.onfail=poweroff), the machine's SMBIOS
// serial and UUID, a virtio NIC on its tap, a virtio RNG, and its disks.
func qemuArgs(m qemuMachine) []string {
	memory := 2048
	if m.Memory > 0 {
		memory = m.Memory
	}
	args := []string{"-accel", "tcg,thread=multi", "-m", strconv.Itoa(memory), "-smp", "2",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-smbios", "type=1,serial=" + m.Serial + ",uuid=" + m.UUID,
		"-netdev", "tap,id=n0,ifname=" + m.Tap + ",script=no,downscript=no"}
	if m.PXE {
		args = append(args, "-boot", "n",
			"-device", "virtio-net-pci,netdev=n0,mac="+m.MAC+",disable-legacy=on,romfile="+poweronROM+",bootindex=1")
	} else {
		args = append(args, "-kernel", m.Kernel, "-initrd", m.Initrd, "-append", m.Cmdline,
			"-device", "virtio-net-pci,netdev=n0,mac="+m.MAC)
	}
	if m.CPU != "" {
		args = append(args, "-cpu", m.CPU)
	}
	args = append(args, "-device", "virtio-rng-pci")
	if m.TPMSocket != "" {
		args = append(args, "-chardev", "socket,id=chrtpm,path="+m.TPMSocket,
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
	}
	for i, d := range m.Disks {
		id := fmt.Sprintf("disk%d", i)
		args = append(args, "-drive", "if=none,id="+id+",format="+d.Format+",file="+d.File,
			"-device", "virtio-blk-pci,drive="+id+",serial="+d.Serial)
	}
	return args
}

// siteName is a name outside the cluster that the site's resolver (startSiteServices)
// answers with joinHost: a pod resolves it through CoreDNS, which forwards it to the
// node's resolvers, which gpuboot's DHCP named.
const siteName = "site.gpurack.test"

// startSiteServices runs what a site's network has beside gpuboot, on the boot bridge:
// dnsmasq as its DNS resolver at joinHost (it answers siteName; gpuboot's DHCP names it
// to the machines, so CoreDNS has an upstream, as on a real site: with none, CoreDNS's
// forward plugin finds no nameserver and CoreDNS exits), and IPv6 router
// advertisements (without one iPXE spends about 16 s on IPv6 autoconfiguration,
// docs/pxe.md). gpuboot is the DHCP server; dnsmasq serves no DHCP.
func startSiteServices(t *testing.T, env *netnstest.Env, ns, bridge string) {
	t.Helper()
	site := env.Command(ns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--user=root",
		"--bind-interfaces", "--interface="+bridge, "--log-facility=-", "--no-resolv", "--no-hosts",
		"--address=/"+siteName+"/"+joinHost,
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"), "--pid-file=",
		"--enable-ra", "--dhcp-range=fd88::,ra-only")
	if err := site.Start(); err != nil {
		t.Fatalf("start dnsmasq (the site's resolver and router advertisements): %v", err)
	}
	go site.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := netnstest.WaitPortIn(ctx, ns, "tcp", joinHost+":53"); err != nil {
		t.Fatalf("the site's resolver (dnsmasq) does not listen on %s:53: %v", joinHost, err)
	}
}

// rackImages is gpuboot's image store for a rack.
type rackImages struct {
	store   string            // images.store: a directory of image directories
	pubKeys []string          // the keys they are signed with (images.trustedKeys)
	ids     map[string]string // image name (imageTiny, imageSimGPU) -> image ID
}

// imageStore links the images named into a new store directory for gpuboot, from the
// content-addressed image cache (test/rigimage, shared with test/systemdhost).
// GPURACK_JOIN_IMAGE=DIR stands in for the tiny image (a developer's shortcut that
// make test refuses; see rigBinaries).
func imageStore(t *testing.T, bins joinBinaries, names ...string) rackImages {
	t.Helper()
	s := rigimage.NewStore(t, repoRoot(t), bins.gpuimage, names...)
	return rackImages{store: s.Dir, pubKeys: s.PubKeys, ids: s.IDs}
}

// repoRoot is the repository's root directory.
func repoRoot(t *testing.T) string { return rigimage.RepoRoot(t) }

// rigBinaries checks what every rig test needs (the image tools, a control plane's
// binaries, network namespaces) and builds gpuimage, gpuboot and controlplane-bootstrap
// from this tree, once per test binary (rigimage.BuildBinaries).
func rigBinaries(t *testing.T) joinBinaries {
	t.Helper()
	rigimage.RequireImageBuild(t)
	testcluster.Require(t)
	netnstest.Require(t)
	b := rigimage.BuildBinaries(t)
	return joinBinaries{b.Gpuimage, b.Gpuboot, b.ControlPlane}
}

// joinBinaries is gpuimage, gpuboot and controlplane-bootstrap built from this tree.
type joinBinaries struct{ gpuimage, gpuboot, controlplane string }

// rackParallel is how many subtests marked parallel run at once unless -parallel
// says otherwise: TestRack's three node branches (A's, B's GPUs, B's data disks),
// which wait on the emulated machines rather than use the host's CPUs, on a host of
// two (where the default, GOMAXPROCS, held one branch back for the others).
const rackParallel = 3

// TestMain raises the subtests' parallelism to rackParallel when -parallel was not
// given, and removes the binaries the tests built.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if p := flag.Lookup("test.parallel"); !given && p != nil {
		if n, err := strconv.Atoi(p.Value.String()); err == nil && n < rackParallel {
			p.Value.Set(strconv.Itoa(rackParallel))
		}
	}
	code := m.Run()
	rigimage.RemoveBinaries()
	os.Exit(code)
}

// nsDial dials from inside network namespace ns (only IP literals: a name would be
// resolved on another thread, outside ns).
func nsDial(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var derr error
		if err := netnstest.InNamespace(ns, func() error {
			c, derr = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			return nil
		}); err != nil {
			return nil, err
		}
		return c, derr
	}
}

// nsCommand runs name in network namespace ns (`ip netns exec`, which execs it, so the
// process is name itself) in its own process group, killed if the test binary dies.
// Unlike netnstest's Env.Command it is not tied to t.Context, which ends before cleanup
// begins: the callers stop their processes gracefully in t.Cleanup, which runs before
// netnstest deletes the namespace.
func nsCommand(ns, name string, arg ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, name}, arg...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// namespacedControlPlane is `controlplane-bootstrap init --foreground` in a namespace.
type namespacedControlPlane struct {
	adminKubeconfig, enroller string
	// dir is the cluster directory (--dir of the other subcommands).
	dir string
}

// extra is more of cluster.yaml (monitoringConfig's section), or "".
func startNamespacedControlPlane(t *testing.T, env *netnstest.Env, ns, bin, extra string) *namespacedControlPlane {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cluster.yaml")
	// The default single-node layout, but listening on every address of the namespace
	// and with the endpoint the guest reaches (its host is added to the serving
	// certificate's SANs, and it is the server of enroller.kubeconfig and so the
	// JoinBundle's). The advertise address is that host too: it is the kubernetes
	// Service's endpoint, which pods (the probe, CoreDNS) reach through the ClusterIP;
	// the default, loopback, leaves the Service without endpoints.
	cfg := `apiVersion: gpurack.io/v1alpha1
kind: ClusterConfig
clusterName: gpurack-join
apiServer:
  bindAddress: 0.0.0.0
  advertiseAddress: ` + joinHost + `
  endpoint: ` + joinAPI + `
etcd:
  extraArgs: {unsafe-no-fsync: "true"}
` + extra
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	clusterDir := filepath.Join(dir, "cluster")
	var out syncBuffer
	cmd := nsCommand(ns, bin, "init", "--config", cfgPath, "--dir", clusterDir, "--foreground")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// SIGTERM: the supervisor stops its components and waits for them, so that
		// nothing is left in the namespace (netnstest's cleanup would kill only the
		// supervisor's own process group).
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			t.Errorf("controlplane-bootstrap did not stop within 60 s of SIGTERM")
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if pids, _ := exec.Command("ip", "netns", "pids", ns).Output(); strings.TrimSpace(string(pids)) != "" {
			t.Errorf("processes left in namespace %s after the control plane stopped: %s", ns, strings.Fields(string(pids)))
		}
		if t.Failed() {
			t.Logf("controlplane-bootstrap output:\n%s", lastLines(out.String(), 40))
		}
	})
	re := regexp.MustCompile(`(?m)^ready in \S+; admin kubeconfig: (\S+)$`)
	deadline := time.Now().Add(4 * time.Minute)
	var admin string
	for admin == "" {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			admin = m[1]
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("controlplane-bootstrap init exited (%v):\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the control plane was not ready within 4 minutes:\n%s", out.String())
		}
	}
	enrollerDir := filepath.Join(dir, "enroller")
	if _, err := env.Run(ns, bin, "join-config", "--dir", clusterDir, "--out", enrollerDir); err != nil {
		t.Fatal(err)
	}
	return &namespacedControlPlane{adminKubeconfig: admin, enroller: filepath.Join(enrollerDir, "enroller.kubeconfig"), dir: clusterDir}
}

// restConfig is the admin kubeconfig's REST config, its connections made inside ns.
func (c *namespacedControlPlane) restConfig(t *testing.T, ns string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.adminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = nsDial(ns)
	return cfg
}

// clientset is an admin client whose connections are made inside ns.
func (c *namespacedControlPlane) clientset(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.restConfig(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// namespacedGpuboot is `gpuboot serve` in a namespace, advertising joinHost.
type namespacedGpuboot struct {
	env        *netnstest.Env
	ns, bin    string
	pin, creds string
	http       *http.Client
	log        *syncBuffer // what gpuboot wrote to stdout and stderr
}

// gpubootSettings is what a test changes in gpuboot's configuration.
type gpubootSettings struct {
	// bootNet replaces the lines that turn DHCP and TFTP off (YAML: interfaces, dhcp
	// and tftp for a boot network).
	bootNet string
	// podNetwork is cluster.podNetwork (flow YAML, e.g. "{backend: host-gw}").
	podNetwork string
	// policy and enrollment replace gpuboot's policy (default {approval: manual}) and
	// enrollment (default {unknownMachines: discover}) settings (flow YAML).
	policy, enrollment string
	// selectors is gpuboot's selectors (a flow YAML list): which image which machine
	// boots; empty: none, every machine boots the rack's default image.
	selectors string
	// manifest, when set, is the rack manifest (CSV), given as policy.allowlist;
	// stateFiles are written into the state directory after init (mode 0600).
	manifest   string
	stateFiles map[string]string
	// logsEndpoint is cluster.logsEndpoint: the control plane's logs-gateway, where
	// the nodes ship their logs; empty: they ship none.
	logsEndpoint string
	// registry is cluster.registry: the cluster registry the nodes' containerd trusts
	// (hosts.toml with the cluster CA); empty: none.
	registry string
}

// clusterExtraYAML is gpuboot's cluster.logsEndpoint and cluster.registry settings
// (after a comma in a flow map), those that are set.
func clusterExtraYAML(set gpubootSettings) string {
	s := ""
	if set.logsEndpoint != "" {
		s += ", logsEndpoint: '" + set.logsEndpoint + "'"
	}
	if set.registry != "" {
		s += ", registry: '" + set.registry + "'"
	}
	return s
}

// startNamespacedGpuboot starts gpuboot with DHCP and TFTP off, or on a boot network
// as set says.
func startNamespacedGpuboot(t *testing.T, env *netnstest.Env, ns, bin, enroller, store string, pubKeys []string, imageID string, set gpubootSettings) *namespacedGpuboot {
	t.Helper()
	dir := t.TempDir()
	g := &namespacedGpuboot{env: env, ns: ns, bin: bin, creds: filepath.Join(dir, "state", "operators", "admin"),
		http: &http.Client{Transport: &http.Transport{DialContext: nsDial(ns)}, Timeout: 2 * time.Minute}, log: &syncBuffer{}}
	out, err := env.Run(ns, bin, "init", "--state-dir", filepath.Join(dir, "state"), "--advertise", joinHost, "--rack", "r1")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(line, "CA pin (gpurack.enroll.ca): "); ok {
			g.pin = strings.TrimSpace(p)
		}
	}
	if g.pin == "" {
		t.Fatalf("gpuboot init printed no CA pin:\n%s", out)
	}
	set.policy = cmp.Or(set.policy, "{approval: manual}")
	if set.manifest != "" {
		writeFile(t, filepath.Join(dir, "rack.csv"), set.manifest, 0o644)
		set.policy = strings.TrimSuffix(set.policy, "}") + ", allowlist: rack.csv}"
	}
	for name, content := range set.stateFiles {
		writeFile(t, filepath.Join(dir, "state", name), content, 0o600)
	}
	cfg := fmt.Sprintf(`stateDir: state
advertise: %s
listen: {http: ":8080", tls: ":8443"}
images: {store: %s, trustedKeys: [%s]}
racks: [{name: r1, defaultImage: %s}]
%s
enrollment: %s
policy: %s
selectors: %s
logLevel: info
cluster: {kubeconfig: %s, podNetwork: %s%s}
# /metrics on the HTTP port too: the rack's metrics server starts before this gpuboot
# and its metrics-reader certificate exist (monitoringConfig).
metrics: {plainHTTP: true}
`, joinHost, store, strings.Join(pubKeys, ", "), imageID, cmp.Or(set.bootNet, "dhcp: {enabled: false}\ntftp: {enabled: false}"),
		cmp.Or(set.enrollment, "{unknownMachines: discover}"), cmp.Or(set.policy, "{approval: manual}"), cmp.Or(set.selectors, "[]"),
		enroller, cmp.Or(set.podNetwork, "{}"), clusterExtraYAML(set))
	cfgPath := filepath.Join(dir, "gpuboot.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	log := g.log
	cmd := nsCommand(ns, bin, "serve", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("gpuboot log:\n%s", lastLines(log.String(), 80))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, addr := range []string{joinHTTP, joinTLS} {
		if err := netnstest.WaitPortIn(ctx, ns, "tcp", addr); err != nil {
			t.Fatalf("gpuboot does not listen on %s: %v\n%s", addr, err, log.String())
		}
	}
	return g
}

// cli runs an operator command against gpuboot with the credentials `gpuboot init` wrote.
func (g *namespacedGpuboot) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := g.env.Run(g.ns, g.bin, append(args, "--server", joinTLS, "--credentials", g.creds)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// machine returns `gpuboot machines show REF -o json`, or nil while gpuboot knows no
// such machine.
func (g *namespacedGpuboot) machine(t *testing.T, ref string) *bootv1.Machine {
	t.Helper()
	out, err := g.env.Run(g.ns, g.bin, "machines", "show", ref, "-o", "json", "--server", joinTLS, "--credentials", g.creds)
	if err != nil {
		return nil
	}
	var m bootv1.Machine
	if err := protojson.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("gpuboot machines show -o json is not a Machine: %v\n%s", err, out)
	}
	return &m
}

// bootScriptFor fetches /boot.ipxe for a machine's identity, as iPXE would, and
// downloads the kernel and initrd it names. It returns their paths and the kernel
// arguments with iPXE's ${net0/mac:hexhyp} filled in.
func (g *namespacedGpuboot) bootScriptFor(t *testing.T, ctx context.Context, mac, uuid, serial string) (kernel, initrd, cmdline string) {
	t.Helper()
	get := func(url string) []byte {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := g.http.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %v\n%.2000s", url, resp.Status, err, body)
		}
		return body
	}
	script := string(get("http://" + joinHTTP + "/boot.ipxe?mac=" + mac + "&uuid=" + uuid + "&serial=" + serial))
	var kernelURL, initrdURL string
	for _, line := range strings.Split(script, "\n") {
		line, _, _ = strings.Cut(strings.TrimSpace(line), " || ")
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "kernel":
			kernelURL, cmdline = f[1], strings.Join(f[2:], " ")
		case len(f) >= 2 && f[0] == "initrd":
			initrdURL = f[1]
		}
	}
	if kernelURL == "" || initrdURL == "" {
		t.Fatalf("/boot.ipxe is not a boot script:\n%s", script)
	}
	cmdline = strings.ReplaceAll(cmdline, "${net0/mac:hexhyp}", strings.ReplaceAll(mac, ":", "-"))
	dir := t.TempDir()
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(kernel, get(kernelURL), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, get(initrdURL), 0o644); err != nil {
		t.Fatal(err)
	}
	return kernel, initrd, cmdline
}

// serialConsole collects QEMU's serial console line by line.
type serialConsole struct {
	start   time.Time
	mu      sync.Mutex
	lines   []string
	done    chan struct{} // closed when QEMU's output ends
	logPath string        // the raw console, as QEMU wrote it
}

// startNamedConsole starts QEMU's cmd (its serial console on stdout) and collects the
// console; the lines it logs start with name. t.Cleanup kills QEMU and waits for its
// console reader.
func startNamedConsole(t *testing.T, cmd *exec.Cmd, name string) *serialConsole {
	t.Helper()
	if name != "" {
		name += ": "
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	c := &serialConsole{start: time.Now(), done: make(chan struct{}), logPath: filepath.Join(t.TempDir(), "serial.log")}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logPath := c.logPath
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(io.TeeReader(stdout, logFile))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimSpace(stripANSI(sc.Text()))
			c.mu.Lock()
			c.lines = append(c.lines, line)
			c.mu.Unlock()
			if strings.Contains(line, "gpurack") || strings.Contains(line, "gpuagent") || strings.Contains(line, "kubelet") || strings.Contains(line, "kube-proxy") {
				t.Logf("%6.1fs %s%s", time.Since(c.start).Seconds(), name, line)
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
		cmd.Wait()
		logFile.Close()
		if t.Failed() {
			t.Logf("serial console tail:\n%s", lastLines(c.text(), 80))
		}
	})
	return c
}

func (c *serialConsole) since() time.Duration { return time.Since(c.start) }

func (c *serialConsole) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

func (c *serialConsole) tail() string { return "serial console tail:\n" + lastLines(c.text(), 60) }

// mark is the number of lines the console has shown: waitFrom(mark) waits for a line
// that comes after them.
func (c *serialConsole) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lines)
}

// waitFor waits until a console line matches re and returns its submatches; it fails
// the test when QEMU exits or limit passes first.
func (c *serialConsole) waitFor(t *testing.T, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	return c.waitFrom(t, re, 0, limit)
}

// waitFrom is waitFor for a line after the first from lines (mark): a new occurrence.
func (c *serialConsole) waitFrom(t *testing.T, re *regexp.Regexp, from int, limit time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(limit)
	seen := from
	for {
		c.mu.Lock()
		lines := c.lines[min(seen, len(c.lines)):]
		seen = max(seen, len(c.lines))
		c.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		select {
		case <-c.done:
			t.Fatalf("QEMU ended after %s before the console showed %q\n%s", c.since().Round(time.Second), re, c.tail())
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the serial console did not show %q within %s %s\n%s", re, limit, journalHint, c.tail())
		}
	}
}

// waitFor polls cond every 2 s until it holds, failing the test after limit with
// what the explain functions say.
func waitFor(t *testing.T, ctx context.Context, limit time.Duration, what string, cond func() bool, explain ...func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			msg := fmt.Sprintf("timed out after %s waiting for: %s %s", limit, what, journalHint)
			for _, e := range explain {
				msg += "\n" + e()
			}
			t.Fatal(msg)
		}
		time.Sleep(2 * time.Second)
	}
}

func hasAddress(n *corev1.Node, typ corev1.NodeAddressType, addr string) bool {
	return slices.ContainsFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Type == typ && a.Address == addr })
}

func nodeHasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

func nodeCondition(n *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// containsInOrder reports whether want appears in got as a subsequence.
func containsInOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

//go:build linux

package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// twoNodeMachine is one machine of TestTwoNodePodNetwork.
type twoNodeMachine struct{ mac, ip, serial, uuid, node string }

var twoNodeMachines = []twoNodeMachine{
	{"52:54:00:e2:e0:21", "10.0.2.21", "GPR-TWO-0001", "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e21", "gpu-r1-a"},
	{"52:54:00:e2:e0:22", "10.0.2.22", "GPR-TWO-0002", "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e22", "gpu-r1-b"},
}

// TestTwoNodePodNetwork boots two machines on one boot network (a bridge in a
// namespace, gpuboot's full DHCP with a reservation each), approves both, waits for
// both Nodes to be Ready, then has a pod on node A reach a pod on node B by its pod IP
// and through a ClusterIP Service: the pod network across nodes and kube-proxy. It
// runs once per flannel backend, vxlan and host-gw; the backend reaches the nodes in
// their JoinBundle (gpuboot's cluster.podNetwork).
//
// In the vxlan run node B boots the simulated GPU variant of the tiny image
// (simGPUImage, chosen by a gpuboot selector on its MAC; gpuboot allows simulated
// machines), and after the pod network check it must give GPUs to pods
// (simGPUNodeChecks): the device plugin, CDI through nvidia-container-runtime on the
// node's containerd 1.6, XID withdrawal and a kubelet restart, in a QEMU node.
// Everything about its GPUs says simulated. In the host-gw run both machines boot the
// tiny image.
//
// Each run takes about 7 minutes on 2 cores (two emulated machines at once), the GPU
// checks about 5 more. `make test` (CI) runs vxlan; host-gw only with
// GPURACK_E2E_HOSTGW=1, which `make e2e` sets (docs/testing.md).
func TestTwoNodePodNetwork(t *testing.T) {
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	bins, imageDir, pubKey := joinImage(t)
	simGPUDir := ""
	if os.Getenv("GPURACK_JOIN_IMAGE") == "" {
		simGPUDir = simGPUImage(t, bins)
	} else {
		t.Log("GPURACK_JOIN_IMAGE: node B boots that image in both runs, and the simulated GPU node's checks do not run (its image is built from this tree into another store); unset it to run them")
	}
	for _, backend := range []string{"vxlan", "host-gw"} {
		gpuDir := ""
		if backend == "vxlan" {
			gpuDir = simGPUDir
		}
		t.Run(backend, func(t *testing.T) {
			if backend == "host-gw" {
				testreq.OptIn(t, "GPURACK_E2E_HOSTGW", "a second two-node run, with flannel host-gw, about 7 minutes: CI's hour has room for one two-node run (vxlan, with the simulated GPU node); make e2e runs both")
			}
			twoNodes(t, bins, imageDir, pubKey, gpuDir, backend)
		})
	}
}

// twoNodes is one run of TestTwoNodePodNetwork; with simGPUDir set, node B boots that
// image (in the same store, signed with the same key) and gets the GPU checks.
func twoNodes(t *testing.T, bins joinBinaries, imageDir, pubKey, simGPUDir, backend string) {
	imageID := filepath.Base(imageDir)
	env := netnstest.New(t)
	ns := env.Namespace()
	br := env.Bridge(ns)
	env.AddAddr(br, joinHost+poweronPrefix)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	t.Cleanup(cancel)

	cp := startNamespacedControlPlane(t, env, ns, bins.controlplane)
	admin := cp.clientset(t, ns)
	t.Cleanup(func() { // after QEMU is killed, before the control plane stops
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, m := range twoNodeMachines {
			if err := admin.CoreV1().Nodes().Delete(ctx, m.node, metav1.DeleteOptions{}); err != nil && !strings.Contains(err.Error(), "not found") {
				t.Errorf("delete Node %s: %v", m.node, err)
			}
		}
	})
	enrollment, selectors := "", ""
	if simGPUDir != "" {
		if filepath.Dir(simGPUDir) != filepath.Dir(imageDir) {
			t.Fatalf("the simulated GPU image %s is not in the tiny image's store %s", simGPUDir, filepath.Dir(imageDir))
		}
		enrollment = "{unknownMachines: discover, allowSimulated: true}"
		selectors = fmt.Sprintf(`[{name: sim-gpu, match: {machine: "%s"}, image: %s}]`, twoNodeMachines[1].mac, filepath.Base(simGPUDir))
	}
	var reservations []string
	for _, m := range twoNodeMachines {
		reservations = append(reservations, fmt.Sprintf(`{mac: "%s", ip: %s}`, m.mac, m.ip))
	}
	g := startNamespacedGpuboot(t, env, ns, bins.gpuboot, cp.enroller, filepath.Dir(imageDir), pubKey, imageID, gpubootSettings{
		bootNet: fmt.Sprintf(`interfaces: [{name: %s}]
dhcp:
  mode: full
  pool: {start: 10.0.2.100, end: 10.0.2.199, netmask: 255.255.255.0, routers: [%s], leaseTime: 1h}
  reservations: [%s]
tftp: {enabled: false}`, br.Name, joinHost, strings.Join(reservations, ", ")),
		podNetwork: "{backend: " + backend + "}",
		clusterDNS: clusterDNSAddress(t, ctx, admin),
		enrollment: enrollment,
		selectors:  selectors,
	})

	// Both machines boot at once, as a rack does: the kernel and initrd from the boot
	// script gpuboot gives each identity, the network from gpuboot's DHCP.
	cons := make([]*serialConsole, len(twoNodeMachines))
	for i, m := range twoNodeMachines {
		kernel, initrd, cmdline := g.bootScriptFor(t, ctx, m.mac, m.uuid, m.serial)
		cmdline += " gpurack.onfail=poweroff"
		if os.Getenv("GPURACK_JOIN_JOURNAL") == "1" {
			cmdline += " systemd.journald.forward_to_console=1"
		}
		tap := env.Tap(ns)
		env.Attach(br, tap)
		cons[i] = startNamedConsole(t, twoNodeQEMU(ns, tap.Name, m, kernel, initrd, cmdline), m.node)
	}
	wait := regexp.MustCompile(`gpuagent: waiting for approval`)
	for i, m := range twoNodeMachines {
		cons[i].waitFor(t, wait, bootToWaitLimit)
		g.cli(t, "machines", "approve", m.mac, "--reason", "TestTwoNodePodNetwork", "--node-name", m.node)
	}
	approved := time.Now()
	nodes := make([]*corev1.Node, len(twoNodeMachines))
	for i, m := range twoNodeMachines {
		waitFor(t, ctx, approveToNode+nodeToReady, "Node "+m.node+" Ready", func() bool {
			n, err := admin.CoreV1().Nodes().Get(ctx, m.node, metav1.GetOptions{})
			if err != nil {
				return false
			}
			nodes[i] = n
			r := nodeCondition(n, corev1.NodeReady)
			return r != nil && r.Status == corev1.ConditionTrue
		}, cons[i].tail)
		if !hasAddress(nodes[i], corev1.NodeInternalIP, m.ip) {
			t.Errorf("Node %s addresses %v: no InternalIP %s (its DHCP reservation)", m.node, nodes[i].Status.Addresses, m.ip)
		}
		// The backend the node runs is the bundle's, not the image's default.
		if want := "starting flannel (" + backend + ")"; !strings.Contains(cons[i].text(), want) {
			t.Errorf("%s's console lacks %q: the JoinBundle's backend was not used", m.node, want)
		}
	}
	t.Logf("approve -> both Nodes Ready (%s): %s; podCIDRs %s and %s", backend, time.Since(approved).Round(time.Second),
		nodes[0].Spec.PodCIDR, nodes[1].Spec.PodCIDR)
	if nodes[0].Spec.PodCIDR == nodes[1].Spec.PodCIDR {
		t.Fatalf("both Nodes have podCIDR %s", nodes[0].Spec.PodCIDR)
	}
	crossNodeFetch(t, ctx, admin, nodes[0], nodes[1], backend)
	if simGPUDir != "" {
		simGPUNodeChecks(t, ctx, admin, g, nodes[1], twoNodeMachines[1].ip)
	}
}

// twoNodeQEMU is QEMU (TCG) for machine m, booting kernel and initrd with its NIC on
// the tap tap.
func twoNodeQEMU(ns, tap string, m twoNodeMachine, kernel, initrd, cmdline string) *exec.Cmd {
	return nsCommand(ns, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-m", "2048", "-smp", "2",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-smbios", "type=1,serial="+m.serial+",uuid="+m.uuid,
		"-kernel", kernel, "-initrd", initrd, "-append", cmdline,
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac="+m.mac,
		"-device", "virtio-rng-pci")
}

// crossNodeFetch runs the probe's HTTP server in a pod on node b behind a ClusterIP
// Service, then a pod on node a that fetches it by pod IP and through the Service.
// kube-proxy on node a programs the Service a moment after its EndpointSlice appears,
// so the client pod is tried up to three times; every attempt is logged.
func crossNodeFetch(t *testing.T, ctx context.Context, admin kubernetes.Interface, a, b *corev1.Node, backend string) {
	t.Helper()
	got, svc := startProbeServer(t, ctx, admin, b, metav1.NamespaceDefault, "probe-server")
	byIP := fmt.Sprintf("http://%s:8080/", got.Status.PodIP)
	bySvc := fmt.Sprintf("http://%s/", svc.Spec.ClusterIP)
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		done, err := runPodToEnd(ctx, admin, probePod(a, fmt.Sprintf("probe-client-%d", attempt), "fetch", byIP, bySvc), 3*time.Minute)
		if err == nil {
			t.Logf("%s: a pod on %s (%s) fetched a pod on %s (%s) by pod IP and through ClusterIP %s (attempt %d):\n%s",
				backend, a.Name, done.Status.PodIP, b.Name, got.Status.PodIP, svc.Spec.ClusterIP, attempt, terminationMessage(done))
			return
		}
		lastErr = err
		t.Logf("attempt %d: %v", attempt, err)
		time.Sleep(10 * time.Second)
	}
	t.Fatalf("%s: a pod on %s never reached the pod on %s (%s, %s): %v", backend, a.Name, b.Name, byIP, bySvc, lastErr)
}

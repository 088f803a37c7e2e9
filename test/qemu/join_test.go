//go:build linux

package qemu

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The node's view of the servers: QEMU's user-mode network (slirp) sends the guest's
// connections to 10.0.2.2 to 127.0.0.1 of the namespace QEMU runs in. The test gives
// that namespace 10.0.2.2 on its loopback as well, so gpuboot and the test reach the API
// server at the very endpoint the JoinBundle names, as they would on a real rack.
const (
	joinHost    = "10.0.2.2"
	joinAPI     = joinHost + ":6443"
	joinHTTP    = joinHost + ":8080"
	joinTLS     = joinHost + ":8443"
	joinMAC     = "52:54:00:e2:e0:10"
	joinGuestIP = "10.0.2.15" // the guest's slirp address, its Node's InternalIP
	joinSerial  = "GPR-JOIN-0001"
	joinUUID    = "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e10"
	joinNode    = "gpu-r1-qemu"
	joinKubelet = "v1.34.2" // what `make k8s-bins` pins and gpuimage ships
)

// journalHint says how to see more of the guest after a failure.
const journalHint = "(GPURACK_JOIN_JOURNAL=1 puts the guest's journal on the serial console)"

// Generous guards for a loaded 2-core host under TCG, not performance assertions.
const (
	bootToWaitLimit = 8 * time.Minute
	approveToNode   = 6 * time.Minute
	nodeToReady     = 3 * time.Minute
)

// TestTinyNodeJoin is the whole life of a real node, nothing simulated: the tiny
// image built from this tree boots in QEMU from gpuboot's signed image store with the
// kernel command line gpuboot's /boot.ipxe gives (CONTRACTS §3); the agent in it
// registers and says "waiting for approval" on the serial console; after `gpuboot
// machines approve` it takes its JoinBundle, sets the node name as hostname through
// org.freedesktop.hostname1, writes kubelet's bootstrap kubeconfig and config.yaml and
// starts the image's kubelet.service through org.freedesktop.systemd1 (CONTRACTS §6);
// that kubelet does the TLS bootstrap and registers the Node, the agent labels it and
// reports commissioning, and gpuboot moves the machine to ready and removes
// gpurack.io/unvalidated.
//
// Everything on the host side runs in a network namespace (see joinHost): the control
// plane (`controlplane-bootstrap init --foreground`), gpuboot (`gpuboot serve`) and
// QEMU. GPURACK_JOIN_IMAGE=DIR reuses an image directory instead of building one (for
// iterating on the test; its agent is then whatever was built into it), with
// GPURACK_JOIN_IMAGE_PUBKEY naming its signing key (default: gpuimage's default key).
// GPURACK_JOIN_JOURNAL=1 forwards the guest's journal (agent, kubelet, systemd) to the
// serial console, which the test logs.
func TestTinyNodeJoin(t *testing.T) {
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	bins, imageDir, pubKey := joinImage(t)
	imageID := filepath.Base(imageDir)

	env := netnstest.New(t)
	ns := env.Namespace()
	env.AddAddr(netnstest.Link{Name: "lo", Netns: ns}, joinHost+"/32")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	t.Cleanup(cancel)

	t0 := time.Now()
	cp := startNamespacedControlPlane(t, env, ns, bins.controlplane)
	admin := cp.clientset(t, ns)
	t.Logf("control plane up in the namespace in %s (endpoint https://%s)", time.Since(t0).Round(time.Millisecond), joinAPI)
	// Registered before QEMU starts, so it runs after QEMU is killed (a live kubelet
	// would register the Node again) and before the control plane stops.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := admin.CoreV1().Nodes().Delete(ctx, joinNode, metav1.DeleteOptions{})
		if err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete Node %s: %v", joinNode, err)
		}
	})

	g := startNamespacedGpuboot(t, env, ns, bins.gpuboot, cp.enroller, filepath.Dir(imageDir), pubKey, imageID,
		gpubootSettings{clusterDNS: clusterDNSAddress(t, ctx, admin)})

	// What iPXE would do: fetch /boot.ipxe with the machine's identity, then the kernel
	// and initrd it names from gpuboot's image store (served only if the signature
	// verifies). The guest itself fetches the rootfs named by gpurack.rootfs=.
	kernel, initrd, cmdline := g.bootScript(t, ctx)
	cmdline += " gpurack.onfail=poweroff"
	if os.Getenv("GPURACK_JOIN_JOURNAL") == "1" {
		// The guest's whole journal on the serial console: slow, for debugging.
		cmdline += " systemd.journald.forward_to_console=1"
	}
	t.Logf("kernel command line from gpuboot: %s", cmdline)
	for _, want := range []string{"gpurack.rootfs=http://" + joinHTTP + "/images/" + imageID + "/rootfs.squashfs",
		"BOOTIF=01-" + strings.ReplaceAll(joinMAC, ":", "-"), "gpurack.enroll=" + joinTLS, "gpurack.enroll.ca=" + g.pin} {
		if !strings.Contains(cmdline, want) {
			t.Errorf("gpuboot's kernel command line lacks %q", want)
		}
	}

	env.AddAddr(netnstest.Link{Name: "lo", Netns: ns}, joinGuestIP+"/32")
	con := startJoinQEMU(t, ns, kernel, initrd, cmdline)

	// 1. The agent registers and shows the wait, and the key to approve, on the console.
	m := con.waitFor(t, regexp.MustCompile(`gpuagent: waiting for approval \(gpuboot `+regexp.QuoteMeta(joinTLS)+`, key (sha256:[0-9a-f]{64})\)`), bootToWaitLimit)
	consoleKey := m[1]
	bootToWait := con.since()
	t.Logf("boot -> \"waiting for approval\" on the serial console: %s", bootToWait.Round(time.Second))
	var mach *bootv1.Machine
	waitFor(t, ctx, time.Minute, "gpuboot records the registration", func() bool {
		mach = g.machine(t, joinMAC)
		return mach.GetState() == bootv1.MachineState_MACHINE_STATE_REGISTERED
	})
	if mach.GetKeyFingerprint() != consoleKey {
		t.Errorf("gpuboot holds key %s, the console showed %s: an operator comparing them would refuse", mach.GetKeyFingerprint(), consoleKey)
	}
	if id := mach.GetIdentity(); id.GetSerial() != joinSerial || id.GetSmbiosUuid() != joinUUID {
		t.Errorf("registered identity %v, want serial %s uuid %s (QEMU -smbios type=1)", id, joinSerial, joinUUID)
	}
	if got := mach.GetFacts().GetImageId(); got != imageID {
		t.Errorf("registered facts say image %q, want %s", got, imageID)
	}

	// 2. Approval: the agent gets its bundle and starts the image's kubelet, which
	// registers the Node under the hostname the agent set.
	approved := time.Now()
	g.cli(t, "machines", "approve", joinMAC, "--reason", "TestTinyNodeJoin", "--node-name", joinNode)
	var node *corev1.Node
	getNode := func() *corev1.Node {
		n, err := admin.CoreV1().Nodes().Get(ctx, joinNode, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return n
	}
	nodeNames := func() string {
		var names []string
		if l, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
			for _, n := range l.Items {
				names = append(names, n.Name)
			}
		}
		return fmt.Sprintf("Nodes in the cluster: %v (kubelet names the Node after the guest's hostname)", names)
	}
	waitFor(t, ctx, approveToNode, "kubelet in the guest registers Node "+joinNode, func() bool {
		node = getNode()
		return node != nil && node.Status.NodeInfo.KubeletVersion != ""
	}, nodeNames)
	approveToNodeTook := time.Since(approved)
	t.Logf("approve -> Node %s registered by kubelet %s: %s", joinNode, node.Status.NodeInfo.KubeletVersion, approveToNodeTook.Round(time.Second))
	if v := node.Status.NodeInfo.KubeletVersion; v != joinKubelet {
		t.Errorf("Node %s: kubeletVersion %q, want %s (the image's kubelet)", joinNode, v, joinKubelet)
	}
	// kubelet names the Node, its Hostname address and its kubernetes.io/hostname label
	// after the kernel's hostname: the transient hostname the agent set through
	// hostname1 (the image boots as "gpurack", its fallback hostname).
	if !hasAddress(node, corev1.NodeHostName, joinNode) || node.Labels[corev1.LabelHostname] != joinNode {
		t.Errorf("Node %s: addresses %v, label %s=%q: the guest's hostname is not the node name", joinNode, node.Status.Addresses, corev1.LabelHostname, node.Labels[corev1.LabelHostname])
	}
	if !hasAddress(node, corev1.NodeInternalIP, joinGuestIP) {
		t.Errorf("Node %s addresses %v: no InternalIP %s (the guest's slirp address)", joinNode, node.Status.Addresses, joinGuestIP)
	}
	if !strings.Contains(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("Node %s container runtime %q, want the image's containerd", joinNode, node.Status.NodeInfo.ContainerRuntimeVersion)
	}

	// 3. The agent picks up kubelet's node credentials (its label on the Node), reports
	// commissioning, and gpuboot moves the machine to ready and lifts the taint.
	waitFor(t, ctx, nodeToReady, "machine ready, gpurack.io/unvalidated removed, the agent's label and GPUHealthy on the Node", func() bool {
		node = getNode()
		mach = g.machine(t, joinMAC)
		return node != nil && mach.GetState() == bootv1.MachineState_MACHINE_STATE_READY && !nodeHasTaint(node, "gpurack.io/unvalidated") &&
			node.Labels["gpurack.io/image"] == imageID && nodeCondition(node, "GPUHealthy") != nil
	}, func() string {
		if node == nil {
			return fmt.Sprintf("gpuboot: machine %s; Node %s gone", mach.GetState(), joinNode)
		}
		return fmt.Sprintf("gpuboot: machine %s; Node taints %v, labels %v", mach.GetState(), node.Spec.Taints, node.Labels)
	})
	t.Logf("Node -> machine ready and gpurack.io/unvalidated removed: %s (approve -> ready %s)",
		(time.Since(approved) - approveToNodeTook).Round(time.Second), time.Since(approved).Round(time.Second))
	if mach.GetNodeName() != joinNode {
		t.Errorf("gpuboot machine node name %q, want %s", mach.GetNodeName(), joinNode)
	}
	var path []string
	for _, tr := range mach.GetHistory() {
		path = append(path, strings.ToLower(strings.TrimPrefix(tr.GetTo().String(), "MACHINE_STATE_")))
	}
	if want := []string{"approved", "joining", "commissioning", "ready"}; !containsInOrder(path, want) {
		t.Errorf("gpuboot history %v lacks %v in order", path, want)
	}
	if c := nodeCondition(node, "GPUHealthy"); c != nil {
		t.Logf("Node %s: GPUHealthy=%s (%s), labels %v", joinNode, c.Status, c.Reason, node.Labels)
	}
	// 4. The pod network (gpuagent's agent/podnet: podCIDR, flannel vxlan, the
	// conflist) makes kubelet report Ready.
	waitFor(t, ctx, nodeToReady, "Node Ready=True (the pod network up)", func() bool {
		node = getNode()
		r := nodeCondition(node, corev1.NodeReady)
		return r != nil && r.Status == corev1.ConditionTrue
	}, func() string {
		if r := nodeCondition(node, corev1.NodeReady); r != nil {
			return fmt.Sprintf("Ready=%s (%s: %s)", r.Status, r.Reason, r.Message)
		}
		return "no Ready condition"
	})
	t.Logf("Node %s: Ready=True, podCIDR %s", joinNode, node.Spec.PodCIDR)
	// Ready waits for kube-proxy's rules (the pod network writes the conflist after),
	// and kube-proxy has turned liberal TCP conntrack on (without it, the held
	// connection below was now and then reset at the restarts: kubernetes#74839).
	if want := "gpuagent: kube-proxy: Service rules in place; TCP conntrack liberal"; !strings.Contains(con.text(), want) {
		t.Errorf("the Node is Ready but the console lacks %q", want)
	}
	// 5. Pods: the probe reaches the apiserver through the kubernetes Service's
	// ClusterIP, resolves names through CoreDNS, and still does after gpuagent and
	// kube-proxy restart.
	runProbePod(t, ctx, admin, node)
	restartNodeServices(t, ctx, admin, node, con)
	// 6. Tenants: their NetworkPolicies are enforced on the node.
	tenantIsolation(t, ctx, env, ns, bins.controlplane, cp, admin, node, con)

	log := con.text()
	bootLine := regexp.MustCompile(`gpurack: booted image ` + imageID + ` .*gpuagent\.service=active`)
	if !bootLine.MatchString(log) {
		t.Errorf("the serial console lacks %q", bootLine)
	}
	t.Logf("timings: boot -> waiting for approval %s, approve -> Node %s, approve -> ready %s",
		bootToWait.Round(time.Second), approveToNodeTook.Round(time.Second), time.Since(approved).Round(time.Second))
}

// probeImage is the tag hack/probe-image.sh gives the probe archive.
const probeImage = "gpurack.io/probe:v1"

// runProbePod runs the preloaded probe image on node: `probe fetch` of the apiserver's
// /version through the kubernetes Service's ClusterIP. The pod must succeed (the
// probe exits 1 on no answer) with an address in the Node's podCIDR. Then, once the
// cluster DNS Deployment (CoreDNS from the preloaded archive) is available, probes
// resolve kubernetes.default and kube-dns.kube-system.svc through it to their
// ClusterIPs.
func runProbePod(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node) {
	t.Helper()
	svc, url := kubernetesService(t, ctx, admin)
	// The peer of the ClusterIP: the apiserver's own endpoint, from the same pod, so
	// the two connect times differ by kube-proxy's DNAT and little else.
	eps, err := admin.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil || len(eps.Endpoints) == 0 || len(eps.Endpoints[0].Addresses) == 0 || len(eps.Ports) == 0 || eps.Ports[0].Port == nil {
		t.Fatalf("the kubernetes EndpointSlice: %v %v", eps, err)
	}
	direct := fmt.Sprintf("https://%s/version", net.JoinHostPort(eps.Endpoints[0].Addresses[0], fmt.Sprint(*eps.Ports[0].Port)))
	t0 := time.Now()
	got, err := runPodToEnd(ctx, admin, probePod(node, "probe", "fetch", url, direct, url), 3*time.Minute)
	if err != nil {
		nodeNetworkDiagnostics(t, ctx, admin, node, url, direct)
		t.Fatal(err)
	}
	t.Logf("probe pod create -> Succeeded: %s (fetched %s through the ClusterIP)", time.Since(t0).Round(time.Second), url)
	logNodeFigures(t, node, got)
	cidr, err := netip.ParsePrefix(node.Spec.PodCIDR)
	if err != nil {
		t.Fatalf("Node podCIDR: %v", err)
	}
	ip, err := netip.ParseAddr(got.Status.PodIP)
	if err != nil || !cidr.Contains(ip) {
		t.Errorf("probe pod IP %q is not in the Node's podCIDR %s", got.Status.PodIP, cidr)
	}

	// Cluster DNS: CoreDNS runs on this node from the image's preloaded archive.
	dnsSvc, err := admin.CoreV1().Services(clusterdns.Namespace).Get(ctx, clusterdns.ServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the cluster DNS Service: %v", err)
	}
	var dep *appsv1.Deployment
	t0 = time.Now()
	waitFor(t, ctx, 3*time.Minute, "the CoreDNS Deployment available (a replica Ready)", func() bool {
		dep, err = admin.AppsV1().Deployments(clusterdns.Namespace).Get(ctx, clusterdns.Name, metav1.GetOptions{})
		return err == nil && dep.Status.ReadyReplicas > 0
	}, func() string {
		pods, err := admin.CoreV1().Pods(clusterdns.Namespace).List(ctx, metav1.ListOptions{LabelSelector: clusterdns.AppLabel + "=" + clusterdns.AppLabelValue})
		if err != nil {
			return err.Error()
		}
		var out []string
		for i := range pods.Items {
			out = append(out, pods.Items[i].Name+": "+podStatus(&pods.Items[i])+podLogs(ctx, admin, &pods.Items[i]))
		}
		return strings.Join(out, "; ")
	})
	t.Logf("CoreDNS %d/%d replicas ready %s after the probe (image %s)", dep.Status.ReadyReplicas, *dep.Spec.Replicas,
		time.Since(t0).Round(time.Second), dep.Spec.Template.Spec.Containers[0].Image)
	for _, q := range []struct{ pod, name, want string }{
		{"resolve-kubernetes", "kubernetes.default", svc.Spec.ClusterIP},
		{"resolve-kube-dns", clusterdns.ServiceName + "." + clusterdns.Namespace + ".svc", dnsSvc.Spec.ClusterIP},
	} {
		runProbe(t, ctx, admin, node, q.pod, "resolve", q.name, q.want)
		t.Logf("a pod resolved %s to %s through the cluster DNS (%s)", q.name, q.want, dnsSvc.Spec.ClusterIP)
	}
}

// restartNodeServices restarts gpuagent.service (and with it the pod network and
// the device plugin it runs) and kube-proxy.service on the node, from a pod that
// talks to the node's systemd over the host's system bus, then checks that the pod
// network comes back (a new "CNI conflist written" on the console), that the Node
// stays Ready and that a new pod still reaches the apiserver through the kubernetes
// Service and resolves it through the cluster DNS.
func restartNodeServices(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, con *serialConsole) {
	t.Helper()
	conflistUp := regexp.MustCompile(`gpuagent: pod network: podCIDR \S+ via .*CNI conflist \S+ written`)
	before := len(conflistUp.FindAllString(con.text(), -1))
	if before == 0 {
		t.Fatalf("the console never said the pod network was up (%s)", conflistUp)
	}
	pod := restartUnitsPod(node, "restart-node-services", "kube-proxy.service", "gpuagent.service")
	// A connection established before the restarts, from a pod through a ClusterIP
	// Service to a pod, must carry requests through them: the probe holds it and asks
	// every 2 s.
	_, target := startProbeServer(t, ctx, admin, node, metav1.NamespaceDefault, "hold-target")
	holder := probePod(node, "hold-connection", "hold", fmt.Sprintf("http://%s/healthz", target.Spec.ClusterIP), holdFor.String())
	if _, err := admin.CoreV1().Pods(holder.Namespace).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, ctx, admin, holder)
	time.Sleep(5 * time.Second) // its connection is up and has carried a request or two
	t0 := time.Now()
	waitPodSucceeded(t, ctx, admin, pod, 4*time.Minute)
	restarted := time.Now()
	t.Logf("kube-proxy.service and gpuagent.service restarted on the node (%s)", restarted.Sub(t0).Round(time.Second))
	waitFor(t, ctx, 3*time.Minute, "the restarted gpuagent to bring the pod network up again", func() bool {
		return len(conflistUp.FindAllString(con.text(), -1)) > before
	}, con.tail)
	t.Logf("restart -> pod network up again: %s", time.Since(t0).Round(time.Second))
	if r := nodeCondition(mustNode(t, ctx, admin, node.Name), corev1.NodeReady); r == nil || r.Status != corev1.ConditionTrue {
		t.Errorf("Node %s after the restarts: Ready %v", node.Name, r)
	}
	var held *corev1.Pod
	var err error
	waitFor(t, ctx, holdFor+time.Minute, "the hold-connection pod to end", func() bool {
		held, err = admin.CoreV1().Pods(holder.Namespace).Get(ctx, holder.Name, metav1.GetOptions{})
		return err == nil && (held.Status.Phase == corev1.PodSucceeded || held.Status.Phase == corev1.PodFailed)
	})
	switch ended := podEnded(held); {
	case held.Status.Phase != corev1.PodSucceeded:
		t.Errorf("a pod connection through a ClusterIP Service did not survive the restarts: %s", podStatus(held))
	case ended.Before(restarted):
		t.Errorf("the held connection ended at %s, before the restarts were done (%s): lengthen holdFor", ended.Format(time.TimeOnly), restarted.Format(time.TimeOnly))
	default:
		t.Logf("a pod connection through a ClusterIP Service survived the restarts: %s", terminationMessage(held))
	}
	svc, url := kubernetesService(t, ctx, admin)
	runProbe(t, ctx, admin, node, "probe-after-restart", "fetch", url)
	runProbe(t, ctx, admin, node, "resolve-after-restart", "resolve", "kubernetes.default", svc.Spec.ClusterIP)
	t.Logf("after the restarts a new pod still fetched %s through the Service and resolved kubernetes.default", url)
}

// startProbeServer runs the probe's HTTP server (:8080) in a pod named name on node,
// behind a ClusterIP Service of the same name on port 80, and returns both once the
// pod runs and the Service has its endpoint.
func startProbeServer(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, ns, name string) (*corev1.Pod, *corev1.Service) {
	t.Helper()
	labels := map[string]string{"app": name}
	server := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node.Name,
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"serve", "-listen", ":8080"}, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}},
	}
	if _, err := admin.CoreV1().Pods(server.Namespace).Create(ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: labels,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	svc, err := admin.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := waitPodRunning(t, ctx, admin, server)
	waitFor(t, ctx, time.Minute, "the "+name+" Service's endpoint", func() bool {
		eps, err := admin.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svc.Name})
		return err == nil && len(eps.Items) > 0 && len(eps.Items[0].Endpoints) > 0
	})
	return got, svc
}

// restartUnitsPod is a pod on node that restarts the node's systemd units (probe
// restart), talking to systemd over the node's system bus, as root.
func restartUnitsPod(node *corev1.Node, name string, units ...string) *corev1.Pod {
	root := int64(0)
	dir := corev1.HostPathDirectory
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{NodeName: node.Name, RestartPolicy: corev1.RestartPolicyNever,
			Volumes: []corev1.Volume{{Name: "dbus", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/dbus", Type: &dir}}}},
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
				Args: append([]string{"restart"}, units...),
				// The image has no /var/run -> /run link, where the bus library looks.
				Env:                      []corev1.EnvVar{{Name: "DBUS_SYSTEM_BUS_ADDRESS", Value: "unix:path=/run/dbus/system_bus_socket"}},
				SecurityContext:          &corev1.SecurityContext{RunAsUser: &root},
				VolumeMounts:             []corev1.VolumeMount{{Name: "dbus", MountPath: "/run/dbus"}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}}},
	}
}

// holdFor is how long the probe holds its connection across the node's service
// restarts, which take about a minute under TCG.
const holdFor = 3 * time.Minute

// podEnded is when p's container ended (zero while it has not).
func podEnded(p *corev1.Pod) time.Time {
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated != nil {
			return c.State.Terminated.FinishedAt.Time
		}
	}
	return time.Time{}
}

// kubernetesService is the default/kubernetes Service and the URL of the apiserver's
// /version through its ClusterIP.
func kubernetesService(t *testing.T, ctx context.Context, admin kubernetes.Interface) (*corev1.Service, string) {
	t.Helper()
	svc, err := admin.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc, fmt.Sprintf("https://%s:%d/version", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// waitPodRunning waits up to 3 minutes for pod to run with an address.
func waitPodRunning(t *testing.T, ctx context.Context, admin kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	waitFor(t, ctx, 3*time.Minute, "the "+pod.Name+" pod Running on "+pod.Spec.NodeName, func() bool {
		p, err := admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		got = p
		return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	}, func() string { return podStatus(got) })
	return got
}

func mustNode(t *testing.T, ctx context.Context, admin kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Node %s: %v", name, err)
	}
	return n
}

// logNodeFigures logs what the node benchmark reads off one run (make bench-node,
// test/bench/node.sh, docs/benchmarks.md): kubelet's Node registration to Ready, the
// probe pod's create to its container starting (a preloaded image), and the probe's
// TCP connect times to the apiserver through the kubernetes Service's ClusterIP (the
// Service's first packet, through kube-proxy's nftables DNAT) and straight to its
// endpoint (the peer), from the same pod. Logged, never asserted; with
// GPURACK_NODE_FIGURES=FILE also appended to FILE as "name<TAB>seconds" lines.
func logNodeFigures(t *testing.T, node *corev1.Node, probe *corev1.Pod) {
	t.Helper()
	var rows [][2]string
	add := func(what string, d time.Duration) {
		rows = append(rows, [2]string{what, fmt.Sprintf("%.6f", d.Seconds())})
	}
	if r := nodeCondition(node, corev1.NodeReady); r != nil && r.Status == corev1.ConditionTrue {
		add("kubelet registers the Node -> Node Ready", r.LastTransitionTime.Sub(node.CreationTimestamp.Time))
	}
	for _, c := range probe.Status.ContainerStatuses {
		term := c.State.Terminated
		if term == nil {
			continue
		}
		add("pod create -> container started (preloaded image)", term.StartedAt.Sub(probe.CreationTimestamp.Time))
		for i, l := range strings.Split(strings.TrimSpace(term.Message), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || !strings.HasPrefix(f[len(f)-1], "connect=") {
				continue
			}
			d, err := time.ParseDuration(strings.TrimPrefix(f[len(f)-1], "connect="))
			if err != nil {
				continue
			}
			what := "TCP connect through the ClusterIP (Service first packet)"
			switch i {
			case 1:
				what = "TCP connect to the endpoint directly (peer)"
			case 2:
				what = "TCP connect through the ClusterIP, second connection"
			}
			add(what, d)
		}
	}
	logFigures(t, rows)
}

// logFigures logs rows (name, seconds) and appends them to the file
// GPURACK_NODE_FIGURES names, for test/bench/node.sh.
func logFigures(t *testing.T, rows [][2]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("node figures (QEMU -accel tcg, this run):\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-58s %ss\n", r[0], r[1])
	}
	t.Log(b.String())
	if path := os.Getenv("GPURACK_NODE_FIGURES"); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Errorf("GPURACK_NODE_FIGURES: %v", err)
			return
		}
		defer f.Close()
		for _, r := range rows {
			fmt.Fprintf(f, "%s\t%s\n", r[0], r[1])
		}
	}
}

// runProbe runs the probe image with args in a pod named name on node and waits for
// it to succeed; a failed pod fails the test with its last output.
func runProbe(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, name string, args ...string) *corev1.Pod {
	t.Helper()
	return waitPodSucceeded(t, ctx, admin, probePod(node, name, args...), 3*time.Minute)
}

// probePod is a pod named name that runs the probe image with args on node, once.
func probePod(node *corev1.Node, name string, args ...string) *corev1.Pod {
	return probePodIn(metav1.NamespaceDefault, node, name, args...)
}

// probePodIn is probePod in namespace ns.
func probePodIn(ns string, node *corev1.Node, name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node.Name, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Args: args,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}}},
	}
}

// nodeNetworkDiagnostics is run when a pod could not reach the apiserver: the same
// fetches from the node's own network namespace (kube-proxy's rules without the pod
// network), then the node's nftables ruleset, routes and conntrack table through the
// journal (logger -t gpurack-diag), which GPURACK_JOIN_JOURNAL=1 puts on the console.
func nodeNetworkDiagnostics(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, urls ...string) {
	t.Helper()
	host := probePod(node, "diag-host-fetch", append([]string{"fetch"}, urls...)...)
	host.Spec.HostNetwork = true
	p, err := runPodToEnd(ctx, admin, host, 2*time.Minute)
	t.Logf("diagnostics: the same fetches from the node's network namespace: %v\n%s", err, terminationMessage(p))

	state := probePod(node, "diag-node-state", "chroot", "/host", "/bin/sh", "-c",
		"{ nft list ruleset; ip -4 addr; ip -4 route; sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter net.bridge.bridge-nf-call-iptables; "+
			"cat /proc/net/nf_conntrack; } 2>&1 | logger -t gpurack-diag")
	privileged, root := true, int64(0)
	dir := corev1.HostPathDirectory
	state.Spec.HostNetwork = true
	state.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: &dir}}}}
	state.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	state.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
	_, err = runPodToEnd(ctx, admin, state, 2*time.Minute)
	time.Sleep(5 * time.Second) // for the journal to reach the console
	t.Logf("diagnostics: the node's ruleset, routes and conntrack went to its journal (%v) %s", err, journalHint)
}

// terminationMessage is what a pod's containers left as their termination message.
func terminationMessage(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	var out []string
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated != nil {
			out = append(out, c.State.Terminated.Message)
		}
	}
	return strings.Join(out, "\n")
}

// waitPodSucceeded creates pod and waits up to limit for it to succeed; a failed pod
// fails the test with its status and last output.
func waitPodSucceeded(t *testing.T, ctx context.Context, admin kubernetes.Interface, pod *corev1.Pod, limit time.Duration) *corev1.Pod {
	t.Helper()
	got, err := runPodToEnd(ctx, admin, pod, limit)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// runPodToEnd creates pod and waits up to limit for it to succeed. The error says how
// it failed, or where it stood at the limit, with its last output.
func runPodToEnd(ctx context.Context, admin kubernetes.Interface, pod *corev1.Pod, limit time.Duration) (*corev1.Pod, error) {
	if _, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var got *corev1.Pod
	for deadline := time.Now().Add(limit); ; time.Sleep(2 * time.Second) {
		if p, err := admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			got = p
			switch p.Status.Phase {
			case corev1.PodSucceeded:
				return p, nil
			case corev1.PodFailed:
				return p, fmt.Errorf("%s pod failed: %s%s", pod.Name, podStatus(p), podLogs(ctx, admin, p))
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return got, fmt.Errorf("timed out after %s waiting for the %s pod to succeed (%s) %s\n%s%s", limit, pod.Name,
				strings.Join(pod.Spec.Containers[0].Args, " "), journalHint, podStatus(got), podLogs(ctx, admin, got))
		}
	}
}

// podLogs is the tail of a pod's log through the apiserver (which reaches kubelet at
// the Node's InternalIP, forwarded by QEMU), for a failure message.
func podLogs(ctx context.Context, admin kubernetes.Interface, p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tail := int64(40)
	// A container that restarted: the log of the run that ended.
	previous := len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount > 0
	out, err := admin.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail, Previous: previous}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("\n(no log of %s: %v)", p.Name, err)
	}
	return fmt.Sprintf("\nlog of %s:\n%s", p.Name, out)
}

// podStatus is a pod's phase and its containers' states, for a failure message.
func podStatus(p *corev1.Pod) string {
	if p == nil {
		return "no pod"
	}
	out := fmt.Sprintf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			out += fmt.Sprintf("; %s=%s %s", c.Type, c.Status, c.Message)
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			out += fmt.Sprintf("; %s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.State.Terminated != nil:
			out += fmt.Sprintf("; %s exited %d: %s %s", c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason, c.State.Terminated.Message)
		}
	}
	return out
}

type joinBinaries struct{ gpuimage, gpuboot, controlplane string }

// buildJoinBinaries builds the three host-side commands from this tree.
func buildJoinBinaries(t *testing.T, root string) joinBinaries {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./imagebuilder/cmd/gpuimage", "./pxe/cmd/gpuboot", "./controlplane-bootstrap/cmd/controlplane-bootstrap")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return joinBinaries{filepath.Join(dir, "gpuimage"), filepath.Join(dir, "gpuboot"), filepath.Join(dir, "controlplane-bootstrap")}
}

// buildTinyImage locks profiles/tiny.yaml afresh into a temporary copy (the committed
// lock rots as the mirror drops versions), with section appended (for example
// simGPUSection) and the profile renamed name when it is not "tiny", and builds it with
// the agent built from this tree, signed with the private key priv. It returns the
// image directory.
func buildTinyImage(t *testing.T, root, gpuimage, k8sDir, name, section, priv string) string {
	t.Helper()
	tmp := t.TempDir()
	cache := build.DefaultCacheDir() // shared: the .deb cache and apt lists stay warm between runs
	tiny, err := os.ReadFile(filepath.Join(root, "profiles", "tiny.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The probe image, preloaded (profile images:), for the pod the test runs.
	probe := exec.Command(filepath.Join(root, "hack", "probe-image.sh"), filepath.Join(tmp, "probe.tar"))
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("hack/probe-image.sh: %v\n%s", err, out)
	}
	// CoreDNS from pinned source (images/coredns), the cluster DNS Deployment's image.
	coredns := exec.Command(filepath.Join(root, "hack", "coredns-image.sh"), filepath.Join(tmp, "coredns.tar"))
	if out, err := coredns.CombinedOutput(); err != nil {
		t.Fatalf("hack/coredns-image.sh: %v\n%s", err, out)
	}
	src := strings.Replace(string(tiny), "name: tiny\n", "name: "+name+"\n", 1)
	src += "images:\n  - path: probe.tar\n    name: " + probeImage + "\n  - path: coredns.tar\n    name: " + clusterdns.Image + "\n" + section
	prof := filepath.Join(tmp, name+".yaml")
	if err := os.WriteFile(prof, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	runGpuimage(t, root, gpuimage, "lock", prof, "--cache", cache)
	start := time.Now()
	out := runGpuimage(t, root, gpuimage, "build", prof, "--out", filepath.Join(tmp, "store"), "--cache", cache, "--key", priv, "--src", root,
		"--agent-unit", filepath.Join(root, "agent", "systemd", "gpuagent.service"), "--k8s-dir", k8sDir)
	m := regexp.MustCompile(`(?m)^built (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no 'built DIR' line in:\n%s", out)
	}
	t.Logf("built the %s image %s in %s", name, filepath.Base(m[1]), time.Since(start).Round(time.Second))
	return m[1]
}

// runGpuimage runs gpuimage with args in root and returns its output; a failure fails
// the test with that output.
func runGpuimage(t *testing.T, root, gpuimage string, args ...string) string {
	t.Helper()
	cmd := exec.Command(gpuimage, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpuimage %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
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

func startNamespacedControlPlane(t *testing.T, env *netnstest.Env, ns, bin string) *namespacedControlPlane {
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
`
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

// clientset is an admin client whose connections are made inside ns.
func (c *namespacedControlPlane) clientset(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.adminKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = nsDial(ns)
	cs, err := kubernetes.NewForConfig(cfg)
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
	// clusterDNS is cluster.dns, the cluster DNS Service's address (clusterDNSAddress),
	// which kubelet writes into pods' resolv.conf; empty: none (pods get the node's).
	clusterDNS string
	// policy and enrollment replace gpuboot's policy (default {approval: manual}) and
	// enrollment (default {unknownMachines: discover}) settings (flow YAML).
	policy, enrollment string
	// selectors is gpuboot's selectors (a flow YAML list): which image which machine
	// boots; empty: none, every machine boots the rack's default image.
	selectors string
}

// clusterDNSAddress is the ClusterIP of the cluster DNS Service that
// `controlplane-bootstrap init` created: what an operator sets as gpuboot's
// cluster.dns.
func clusterDNSAddress(t *testing.T, ctx context.Context, admin kubernetes.Interface) string {
	t.Helper()
	svc, err := admin.CoreV1().Services(clusterdns.Namespace).Get(ctx, clusterdns.ServiceName, metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP == "" {
		t.Fatalf("the cluster DNS Service %s/%s: %v", clusterdns.Namespace, clusterdns.ServiceName, err)
	}
	return svc.Spec.ClusterIP
}

// startNamespacedGpuboot starts gpuboot with DHCP and TFTP off, or on a boot network
// as set says.
func startNamespacedGpuboot(t *testing.T, env *netnstest.Env, ns, bin, enroller, store, pubKey, imageID string, set gpubootSettings) *namespacedGpuboot {
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
cluster: {kubeconfig: %s, dns: [%s], domain: cluster.local, podNetwork: %s}
`, joinHost, store, pubKey, imageID, cmp.Or(set.bootNet, "dhcp: {enabled: false}\ntftp: {enabled: false}"),
		cmp.Or(set.enrollment, "{unknownMachines: discover}"), cmp.Or(set.policy, "{approval: manual}"), cmp.Or(set.selectors, "[]"),
		enroller, set.clusterDNS, cmp.Or(set.podNetwork, "{}"))
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

// bootScript is bootScriptFor the test machine (joinMAC, joinUUID, joinSerial).
func (g *namespacedGpuboot) bootScript(t *testing.T, ctx context.Context) (kernel, initrd, cmdline string) {
	t.Helper()
	return g.bootScriptFor(t, ctx, joinMAC, joinUUID, joinSerial)
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

// startJoinQEMU boots kernel and initrd under TCG in ns with user-mode networking and
// the test machine's identity. t.Cleanup kills QEMU and waits for its console reader.
func startJoinQEMU(t *testing.T, ns, kernel, initrd, cmdline string) *serialConsole {
	t.Helper()
	return startConsole(t, joinQEMU(ns, kernel, initrd, cmdline))
}

// joinQEMU is the test machine (joinMAC, joinSerial, joinUUID) booting kernel and
// initrd directly, on QEMU's user-mode network (see joinHost), with extra arguments.
func joinQEMU(ns, kernel, initrd, cmdline string, extra ...string) *exec.Cmd {
	args := []string{"-accel", "tcg,thread=multi", "-m", "2048", "-smp", "2",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-smbios", "type=1,serial=" + joinSerial + ",uuid=" + joinUUID,
		"-kernel", kernel, "-initrd", initrd, "-append", cmdline,
		// kubelet's port, forwarded from the guest's own address, which the caller puts
		// on the namespace's loopback: the apiserver reaches kubelet at the Node's
		// InternalIP for pod logs, as on a real network.
		"-netdev", "user,id=n0,hostfwd=tcp:" + joinGuestIP + ":10250-:10250", "-device", "virtio-net-pci,netdev=n0,mac=" + joinMAC,
		"-device", "virtio-rng-pci"}
	return nsCommand(ns, "qemu-system-x86_64", append(args, extra...)...)
}

// startConsole starts QEMU's cmd (its serial console on stdout) and collects the
// console. t.Cleanup kills QEMU and waits for its console reader.
func startConsole(t *testing.T, cmd *exec.Cmd) *serialConsole {
	t.Helper()
	return startNamedConsole(t, cmd, "")
}

// startNamedConsole is startConsole for one of several machines: the lines it logs
// start with name.
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

// waitFor waits until a console line matches re and returns its submatches; it fails
// the test when QEMU exits or limit passes first.
func (c *serialConsole) waitFor(t *testing.T, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(limit)
	seen := 0
	for {
		c.mu.Lock()
		lines := c.lines[seen:]
		seen = len(c.lines)
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

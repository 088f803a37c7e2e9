//go:build linux

package qemu

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/test/rigimage"
)

// probeImage is the tag hack/probe-image.sh gives the probe archive.
const probeImage = rigimage.ProbeImage

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
		// A name outside the cluster: CoreDNS forwards it to the node's resolvers (the
		// site's, from gpuboot's DHCP).
		{"resolve-site", siteName, joinHost},
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
//
// A connection established before the restarts, from a pod through a ClusterIP
// Service to a pod, must carry requests through them and past the pod network's
// return: the hold has to end after "pod network up again", or it did not span what it
// tests. The node's conntrack statistics (the invalid counter, which counted the
// packets of resets before liberal TCP conntrack) are logged before and after. It
// returns the console's line count when the restarts began: what the agent says after
// it is new. run numbers the pods of a repeated run (0: the first).
func restartNodeServices(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, con *serialConsole, run int) int {
	t.Helper()
	named := func(name string) string {
		if run == 0 {
			return name
		}
		return fmt.Sprintf("%s-%d", name, run)
	}
	conflistUp := regexp.MustCompile(`gpuagent: pod network: podCIDR \S+ via .*CNI conflist \S+ written`)
	before := len(conflistUp.FindAllString(con.text(), -1))
	if before == 0 {
		t.Fatalf("the console never said the pod network was up (%s)", conflistUp)
	}
	statsBefore := conntrackStats(t, ctx, admin, node, named("conntrack-before"))
	pod := restartUnitsPod(node, named("restart-node-services"), "kube-proxy.service", "gpuagent.service")
	_, target := startProbeServer(t, ctx, admin, node, metav1.NamespaceDefault, named("hold-target"))
	holder := probePod(node, named("hold-connection"), "hold", fmt.Sprintf("http://%s/healthz", target.Spec.ClusterIP), holdFor.String())
	if _, err := admin.CoreV1().Pods(holder.Namespace).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, ctx, admin, holder)
	time.Sleep(5 * time.Second) // its connection is up and has carried a request or two
	mark := con.mark()
	t0 := time.Now()
	waitPodSucceeded(t, ctx, admin, pod, 4*time.Minute)
	t.Logf("kube-proxy.service and gpuagent.service restarted on the node (%s)", time.Since(t0).Round(time.Second))
	waitFor(t, ctx, 3*time.Minute, "the restarted gpuagent to bring the pod network up again", func() bool {
		return len(conflistUp.FindAllString(con.text(), -1)) > before
	}, con.tail)
	networkUp := time.Now()
	t.Logf("restart -> pod network up again: %s", networkUp.Sub(t0).Round(time.Second))
	if r := nodeCondition(mustNode(t, ctx, admin, node.Name), corev1.NodeReady); r == nil || r.Status != corev1.ConditionTrue {
		t.Errorf("Node %s after the restarts: Ready %v", node.Name, r)
	}
	var held *corev1.Pod
	var err error
	waitFor(t, ctx, holdFor+time.Minute, "the hold-connection pod to end", func() bool {
		held, err = admin.CoreV1().Pods(holder.Namespace).Get(ctx, holder.Name, metav1.GetOptions{})
		return err == nil && podEnd(held) != ""
	})
	switch ended := podEnded(held); {
	case podEnd(held) != corev1.PodSucceeded:
		t.Errorf("a pod connection through a ClusterIP Service did not survive the restarts: %s", podStatus(held))
	case ended.Before(networkUp.Add(-time.Second)): // FinishedAt has whole seconds
		t.Errorf("the held connection ended at %s, before the pod network was up again (%s): it did not span the restarts; lengthen holdFor",
			ended.Format(time.TimeOnly), networkUp.Format(time.TimeOnly))
	default:
		t.Logf("a pod connection through a ClusterIP Service survived the restarts and the pod network's return: %s", terminationMessage(held))
	}
	statsAfter := conntrackStats(t, ctx, admin, node, named("conntrack-after"))
	t.Logf("the node's conntrack statistics (summed over CPUs), before -> after the restarts: %s", conntrackDelta(statsBefore, statsAfter))
	svc, url := kubernetesService(t, ctx, admin)
	runProbe(t, ctx, admin, node, named("probe-after-restart"), "fetch", url)
	runProbe(t, ctx, admin, node, named("resolve-after-restart"), "resolve", "kubernetes.default", svc.Spec.ClusterIP)
	t.Logf("after the restarts a new pod still fetched %s through the Service and resolved kubernetes.default", url)
	return mark
}

// conntrackStats reads the node's /proc/net/stat/nf_conntrack (what `conntrack -S`
// prints: one row of hexadecimal counters per CPU) from a host-network pod named name
// (probe cat),
// and sums each counter over the CPUs. A failure to read is logged, not fatal: the
// figures explain a pass, they are not the check.
func conntrackStats(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, name string) map[string]uint64 {
	t.Helper()
	// The host's network namespace: /proc/net is the node's.
	pod := probePod(node, name, "cat", "/proc/net/stat/nf_conntrack")
	pod.Spec.HostNetwork = true
	p, err := runPodToEnd(ctx, admin, pod, 2*time.Minute)
	if err != nil {
		t.Logf("conntrack statistics: %v", err)
		return nil
	}
	text := terminationMessage(p)
	stats, err := parseConntrackStats(text)
	if err != nil {
		t.Logf("conntrack statistics: %v\n%s", err, text)
	}
	return stats
}

// parseConntrackStats sums /proc/net/stat/nf_conntrack's per-CPU rows by column.
func parseConntrackStats(text string) (map[string]uint64, error) {
	var header []string
	sums := map[string]uint64{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if header == nil {
			if f[0] == "entries" {
				header = f
			}
			continue
		}
		if len(f) != len(header) {
			continue
		}
		for i, v := range f {
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("counter %s: %q is not hexadecimal", header[i], v)
			}
			sums[header[i]] += n
		}
	}
	if header == nil {
		return nil, fmt.Errorf("no header row")
	}
	return sums, nil
}

// conntrackDelta says how the counters that tell of broken connections moved.
func conntrackDelta(before, after map[string]uint64) string {
	if before == nil || after == nil {
		return "not read"
	}
	var out []string
	for _, k := range []string{"invalid", "insert_failed", "drop", "early_drop", "error"} {
		if _, ok := after[k]; ok {
			out = append(out, fmt.Sprintf("%s %d -> %d", k, before[k], after[k]))
		}
	}
	return strings.Join(out, ", ")
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
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Resources: probeResources(),
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
		var lines []string
		for _, r := range rows {
			lines = append(lines, r[0]+"\t"+r[1])
		}
		if err := appendFigures(path, lines); err != nil {
			t.Errorf("GPURACK_NODE_FIGURES: %v", err)
		}
	}
}

// appendFigures appends lines ("name<TAB>value") to the figures file at path, for the
// bench scripts (test/bench/node.sh, storage.sh).
func appendFigures(path string, lines []string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	return err
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

// probeResources are the probe pods' own requests. Without them a tenant's LimitRange
// gives each its default (500m of the node's 2 CPUs), and kubelet counts a pod whose
// program has exited as holding its request until it has torn the pod down, which on
// a loaded emulated node takes minutes: a tenant's next probe pod was then refused
// (OutOfcpu) while the previous one's sandbox was still being stopped.
func probeResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}}
}

// probePodIn is probePod in namespace ns.
func probePodIn(ns string, node *corev1.Node, name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node.Name, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever, Args: args, Resources: probeResources(),
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

	state := hostRootPod(node, "diag-node-state",
		"{ nft list ruleset; ip -4 addr; ip -4 route; sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter net.bridge.bridge-nf-call-iptables; "+
			"cat /proc/net/nf_conntrack; } 2>&1 | logger -t gpurack-diag")
	state.Spec.HostNetwork = true
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
//
// A pod that never restarts has ended once every container has exited, even while its
// phase still says Running: kubelet reports the terminal phase only after it has
// stopped the pod's sandbox (and released its address), which on a loaded emulated node
// has taken minutes after the program's exit.
func runPodToEnd(ctx context.Context, admin kubernetes.Interface, pod *corev1.Pod, limit time.Duration) (*corev1.Pod, error) {
	if _, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var got *corev1.Pod
	for deadline := time.Now().Add(limit); ; time.Sleep(2 * time.Second) {
		if p, err := admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			got = p
			switch podEnd(p) {
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

// podEnd is how pod p ended: its terminal phase, or, for a pod that never restarts
// whose containers have all exited, Succeeded when each exited 0 and Failed otherwise;
// "" while it runs.
func podEnd(p *corev1.Pod) corev1.PodPhase {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return p.Status.Phase
	}
	cs := p.Status.ContainerStatuses
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever || len(cs) == 0 || len(cs) < len(p.Spec.Containers) {
		return ""
	}
	end := corev1.PodSucceeded
	for _, c := range cs {
		switch {
		case c.State.Terminated == nil:
			return ""
		case c.State.Terminated.ExitCode != 0:
			end = corev1.PodFailed
		}
	}
	return end
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

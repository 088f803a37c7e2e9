package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The sysctls kubelet sets on start (pkg/kubelet/cm setupKernelTunables);
// the test puts the host's values back afterwards.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// A real kubelet joins with a bootstrap token: its CSR is approved by the
// controller-manager, the Node goes Ready and a pod from a locally imported
// image runs. containerd and the kubelet run in a network namespace of the
// test's own (the bridge CNI's cni0 and the pod addresses live there, not on
// the host), and the test forwards that namespace's 127.0.0.1:<apiserver
// port> to the host's apiserver. Measured facts for these machines
// (research/k8s-feasibility.md §5): Debian containerd needs
// restrict_oom_score_adj, kubelet needs cgroupDriver cgroupfs (cgroup v1),
// and images come from `ctr images import` (no registry).
func TestRealKubeletJoinRunsPod(t *testing.T) {
	netnstest.Require(t)
	testcluster.Require(t, "kubelet")
	for _, p := range []string{"/usr/bin/containerd", "/usr/bin/ctr", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		testreq.File(t, p, "apt-get install containerd runc containernetworking-plugins (hack/deps.sh lists them)")
	}
	k8sDir := filepath.Dir(components.BinDir(""))
	pauseTar := filepath.Join(k8sDir, "images", "pause.tar")
	tagData, err := os.ReadFile(filepath.Join(k8sDir, "images", "pause.tag"))
	if err != nil {
		testreq.Missing(t, fmt.Sprintf("no pause image (%v)", err), "run make k8s-bins")
	}
	pauseTag := strings.TrimSpace(string(tagData))
	kubelet, _ := components.FindBinary(components.BinDir(""), "kubelet")

	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	token := c.JoinToken(t)
	env := netnstest.New(t)
	ns := env.Namespace()

	// Forward ns's 127.0.0.1:<port> to the apiserver on the host.
	var ln net.Listener
	if err := netnstest.InNamespace(ns, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Config.APIServer.Port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go forward(ln, net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Config.APIServer.Port)))

	dir, err := os.MkdirTemp("", "gpr-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	node := "kubelet-node-1"
	cgroupRoot := "/" + filepath.Base(dir)
	saved := saveSysctls()
	t.Cleanup(func() {
		cleanupNode(t, dir, cgroupRoot)
		restoreSysctls(t, saved)
		cs.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	// The kubelet wants its cgroupRoot to exist in every hierarchy (cgroup
	// v1 here); a new cpuset cgroup starts with no CPUs, so copy them.
	for _, hier := range cgroupHierarchies() {
		p := filepath.Join(hier, cgroupRoot)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatalf("create cgroup %s: %v", p, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(hier, f)); err == nil {
				os.WriteFile(filepath.Join(p, f), v, 0o644)
			}
		}
	}
	sock := filepath.Join(dir, "containerd.sock")
	ports, err := testcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"containerd.toml": fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = %[8]q
`, filepath.Join(dir, "containerd", "root"), filepath.Join(dir, "containerd", "state"), sock, sock+".ttrpc",
			filepath.Join(dir, "containerd", "opt"), pauseTag, filepath.Join(dir, "cni"), filepath.Join(dir, "runc")),
		"cni/10-gpurack-test.conflist": fmt.Sprintf(`{"cniVersion": "0.4.0", "name": %q, "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
`, filepath.Base(dir), filepath.Join(dir, "cni-ipam")),
		"ca.crt": string(c.CAPEM),
		"bootstrap.kubeconfig": fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority: %q}
users:
- name: bootstrap
  user: {token: %q}
contexts:
- name: c
  context: {cluster: c, user: bootstrap}
current-context: c
`, c.Server, filepath.Join(dir, "ca.crt"), token),
		"kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %q
containerRuntimeEndpoint: unix://%s
failSwapOn: false
rotateCertificates: true
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
podLogsDir: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
evictionHard: {}
imageGCHighThresholdPercent: 100
`, cgroupRoot, sock, ports[0], ports[1], filepath.Join(dir, "pod-logs"), filepath.Join(dir, "ca.crt")),
		"node.sh": fmt.Sprintf(`set -e
containerd --config %[1]s/containerd.toml >%[1]s/containerd.log 2>&1 &
for i in $(seq 100); do [ -S %[2]s ] && break; sleep 0.1; done
ctr -a %[2]s -n k8s.io images import %[3]s >%[1]s/import.log 2>&1
exec %[4]s --config=%[1]s/kubelet.yaml --bootstrap-kubeconfig=%[1]s/bootstrap.kubeconfig \
  --kubeconfig=%[1]s/kubelet.kubeconfig --cert-dir=%[1]s/pki --root-dir=%[1]s/root \
  --hostname-override=%[5]s --node-ip=127.0.0.1 >%[1]s/kubelet.log 2>&1
`, dir, sock, pauseTar, kubelet, node),
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// One shell, so containerd and the kubelet share a mount namespace (the
	// kubelet's volume mounts must be visible to containerd). It is a
	// private one, so nothing they mount shows on the host; `ip netns exec`
	// is not used because it remounts /sys without the cgroup hierarchies
	// the kubelet needs.
	cmd := env.Command("", "unshare", "--mount", "--propagation", "private",
		"nsenter", "--net=/run/netns/"+ns, "sh", filepath.Join(dir, "node.sh"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	logs := func() string {
		var b strings.Builder
		for _, f := range []string{"import.log", "containerd.log", "kubelet.log"} {
			fmt.Fprintf(&b, "--- %s:\n%s\n", f, components.TailFile(filepath.Join(dir, f), 15))
		}
		return b.String()
	}

	ctx := ctxFor(t, 4*time.Minute)
	start := time.Now()
	var n *corev1.Node
	for {
		n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node %s not Ready: %v\n%s", node, err, logs())
		}
		select {
		case err := <-exited:
			t.Fatalf("containerd or the kubelet exited (%v)\n%s", err, logs())
		case <-time.After(250 * time.Millisecond):
		}
	}
	t.Logf("node %s Ready %.1fs after the kubelet started", node, time.Since(start).Seconds())
	csrs, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approved := false
	for _, r := range csrs.Items {
		if r.Spec.Username == "system:bootstrap:"+token[:6] && len(r.Status.Certificate) > 0 {
			approved = slices.ContainsFunc(r.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
				return c.Type == certificatesv1.CertificateApproved
			})
		}
	}
	if !approved {
		t.Error("no approved, issued CSR from the bootstrap token")
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "local-image", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: new(bool),
			Containers:                   []corev1.Container{{Name: "pause", Image: pauseTag, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	for {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			t.Logf("pod %s Running on %s with IP %s", p.Name, p.Spec.NodeName, p.Status.PodIP)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pod not Running: %v %+v\n%s", err, p.Status, logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func forward(ln net.Listener, to string) {
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := net.Dial("tcp", to)
			if err != nil {
				return
			}
			defer out.Close()
			go io.Copy(out, in)
			io.Copy(in, out)
		}()
	}
}

func saveSysctls() map[string]string {
	m := map[string]string{}
	for _, s := range kubeletSysctls {
		if v, err := os.ReadFile("/proc/sys/" + s); err == nil {
			m[s] = strings.TrimSpace(string(v))
		}
	}
	return m
}

func restoreSysctls(t *testing.T, m map[string]string) {
	for s, v := range m {
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			t.Logf("restore sysctl %s=%s: %v", s, v, err)
		}
	}
}

// cleanupNode kills everything that ran for the node, by its cgroup and by
// the containerd address only this test uses (the shims leave the
// kubelet's process group), removes its cgroups and deletes dir.
func cleanupNode(t *testing.T, dir, cgroupRoot string) {
	var sockets []string
	for range 3 {
		pids := pidsIn(cgroupRoot)
		pids = append(pids, pidsWithArg(dir)...)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			// The shims' sockets live in containerd's fixed
			// /run/containerd/s; they are the only unix sockets with a
			// path there in this test's network namespace.
			sockets = append(sockets, unixSocketsUnder(pid, "/run/containerd/s/")...)
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(300 * time.Millisecond)
	}
	for _, hier := range cgroupHierarchies() {
		removeCgroupTree(filepath.Join(hier, cgroupRoot))
	}
	for _, s := range sockets {
		os.Remove(s)
	}
	// libcni caches results in /var/lib/cni/results as NETWORK-SANDBOXID-IF,
	// for this test's network and for containerd's own loopback one.
	results, _ := filepath.Glob("/var/lib/cni/results/" + filepath.Base(dir) + "-*")
	sandboxes, _ := os.ReadDir(filepath.Join(dir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io"))
	for _, sb := range sandboxes {
		more, _ := filepath.Glob("/var/lib/cni/results/cni-loopback-" + sb.Name() + "-*")
		results = append(results, more...)
	}
	for _, r := range results {
		os.Remove(r)
	}
	matches, _ := filepath.Glob("/var/log/containers/*.log")
	for _, m := range matches {
		if target, err := os.Readlink(m); err == nil && strings.HasPrefix(target, dir) {
			os.Remove(m)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Logf("remove %s: %v", dir, err)
	}
	// Directories the kubelet, containerd and libcni create on first use;
	// removed only if nothing else is in them.
	for _, d := range []string{"/var/log/containers", "/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"} {
		os.Remove(d)
	}
}

// unixSocketsUnder returns the paths under prefix of the unix sockets in
// pid's network namespace (/proc/PID/net/unix).
func unixSocketsUnder(pid int, prefix string) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && strings.HasPrefix(f[7], prefix) && !slices.Contains(out, f[7]) {
			out = append(out, f[7])
		}
	}
	return out
}

func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

func pidsIn(cgroupRoot string) []int {
	var pids []int
	filepath.WalkDir(filepath.Join("/sys/fs/cgroup/pids", cgroupRoot), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// pidsWithArg lists processes whose command line mentions dir (containerd,
// its shims, the kubelet of this test).
func pidsWithArg(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func removeCgroupTree(p string) {
	entries, err := os.ReadDir(p)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(p, e.Name()))
		}
	}
	syscall.Rmdir(p)
}

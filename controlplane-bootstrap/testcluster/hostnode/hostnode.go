// Package hostnode runs a real kubelet and a real containerd on this machine, joined
// to a testcluster control plane with a bootstrap token: a Kubernetes node without
// booting one, for tests that need kubelet's own behaviour (TLS bootstrap, pods from
// imported archives, the device-plugin manager, the CRI's annotations).
//
// containerd and kubelet run in a network namespace of the test's own (the bridge
// CNI's cni0 and the pod addresses live there, not on the host) and share one private
// mount namespace (kubelet's volume mounts must be visible to containerd, and nothing
// they mount shows on the host). The namespace's 127.0.0.1:<apiserver port> is
// forwarded to the host's apiserver. Measured facts for these machines
// (research/k8s-feasibility.md §5): Debian's containerd needs restrict_oom_score_adj,
// kubelet needs cgroupDriver cgroupfs (cgroup v1 on the host), and images come from
// `ctr images import` (no registry).
package hostnode

import (
	"context"
	"crypto/x509"
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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/apilb"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The sysctls kubelet sets on start (pkg/kubelet/cm setupKernelTunables); Start puts
// the host's values back when the test ends.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// Options configure a Node.
type Options struct {
	// Name is the Node's name; default kubelet-node-1.
	Name string
	// Images are image archives imported into containerd's k8s.io namespace, besides
	// the pause image.
	Images []string
	// CRIConfig, if set, gives TOML put inside containerd's
	// [plugins."io.containerd.grpc.v1.cri"] table, such as a GPU container runtime's
	// part (rootfs.ContainerdGPU.CRIConfig); it gets the node for its paths.
	CRIConfig func(n *Node) string
	// Env is added to containerd's and kubelet's environment (and so the shims' and
	// runtimes').
	Env []string
	// KubeletConfig is YAML added to the KubeletConfiguration (top-level fields).
	KubeletConfig string
	// APIServers, when set, are API servers on this machine's loopback (HOST:PORT)
	// that the node reaches through the node's API load balancer (agent/apilb, run in
	// the test's process with its listener in the node's namespace, where kubelet's
	// kubeconfig points) instead of a plain forward to the cluster's API server.
	APIServers []string
}

// Node is a running kubelet and containerd.
type Node struct {
	Name string
	// Dir holds every file of the node; kubelet's root directory is Dir/root.
	Dir string
	// PauseImage is the sandbox image's tag, also importable as a plain container.
	PauseImage string
	// Token is the bootstrap token kubelet joined with.
	Token string
	// Netns is the network namespace kubelet, containerd and the pods' bridge are in.
	Netns string
	// APILB is the node's API load balancer when Options.APIServers was set.
	APILB *apilb.Balancer

	cs     kubernetes.Interface
	exited chan error
}

// Require stops t unless this machine can run a Node: the network-namespace tools,
// the pinned kubelet, and Debian's containerd, runc and CNI plugins.
func Require(t testing.TB) {
	t.Helper()
	netnstest.Require(t)
	testcluster.Require(t, "kubelet")
	for _, p := range []string{"/usr/bin/containerd", "/usr/bin/ctr", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		testreq.File(t, p, "apt-get install containerd runc containernetworking-plugins (hack/deps.sh lists them)")
	}
}

// Start starts containerd and kubelet for c (Require first) and stops them, removes
// everything they made and deletes the Node object when t ends. It returns once
// kubelet has started; WaitReady waits for the Node.
func Start(t testing.TB, c *testcluster.Cluster, o Options) *Node {
	t.Helper()
	Require(t)
	if o.Name == "" {
		o.Name = "kubelet-node-1"
	}
	pauseTar, pauseTag := pauseImage(t)
	cs := c.Clientset(t)
	token := c.JoinToken(t)
	env := netnstest.New(t)
	ns := env.Namespace()
	var lb *apilb.Balancer
	if len(o.APIServers) > 0 {
		lb = startAPILB(t, ns, c, o.APIServers)
	} else {
		forwardAPIServer(t, ns, c.Config.APIServer.Port)
	}

	dir, err := os.MkdirTemp("", "gpr-kubelet-") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Name: o.Name, Dir: dir, PauseImage: pauseTag, Token: token, Netns: ns, APILB: lb, cs: cs, exited: make(chan error, 1)}
	cgroupRoot := "/" + filepath.Base(dir)
	saved := saveSysctls()
	t.Cleanup(func() {
		if t.Failed() {
			n.keepLogs(t)
		}
		cleanupNode(t, dir, cgroupRoot)
		restoreSysctls(t, saved)
		cs.CoreV1().Nodes().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
	})
	makeCgroupRoot(t, cgroupRoot)
	ports, err := testcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, _ := components.FindBinary(components.BinDir(""), "kubelet")
	files := n.configFiles(c, o, nodeSettings{kubelet: kubelet, pauseTar: pauseTar, cgroupRoot: cgroupRoot, port: ports[0], healthzPort: ports[1]})
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// `ip netns exec` is not used because it remounts /sys without the cgroup
	// hierarchies the kubelet needs.
	cmd := env.Command("", "unshare", "--mount", "--propagation", "private",
		"nsenter", "--net=/run/netns/"+ns, "sh", filepath.Join(dir, "node.sh"))
	cmd.Env = append(os.Environ(), o.Env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.exited <- cmd.Wait() }()
	return n
}

// pauseImage is the pinned sandbox image: its archive and its tag (make k8s-bins).
func pauseImage(t testing.TB) (tar, tag string) {
	k8sDir := filepath.Dir(components.BinDir(""))
	tagData, err := os.ReadFile(filepath.Join(k8sDir, "images", "pause.tag"))
	if err != nil {
		testreq.Missing(t, fmt.Sprintf("no pause image (%v)", err), "run make k8s-bins")
	}
	return filepath.Join(k8sDir, "images", "pause.tar"), strings.TrimSpace(string(tagData))
}

// forwardAPIServer forwards the namespace ns's 127.0.0.1:port to the apiserver on the
// host, until t ends.
func forwardAPIServer(t testing.TB, ns string, port int) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var ln net.Listener
	if err := netnstest.InNamespace(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go forward(ln, addr)
}

// startAPILB runs the node's API load balancer over upstreams until t ends: it listens
// in ns on 127.0.0.1 at the cluster's API port (the address kubelet's kubeconfig
// names) and reaches the API servers from this machine's namespace.
func startAPILB(t testing.TB, ns string, c *testcluster.Cluster, upstreams []string) *apilb.Balancer {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CAPEM)
	var lb *apilb.Balancer
	if err := netnstest.InNamespace(ns, func() (err error) {
		lb, err = apilb.New(apilb.Config{Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Config.APIServer.Port)), Upstreams: upstreams, RootCAs: pool})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lb.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return lb
}

// makeCgroupRoot creates kubelet's cgroupRoot, which it wants in every hierarchy
// (cgroup v1 here); a new cpuset cgroup starts with no CPUs, so they are copied.
func makeCgroupRoot(t testing.TB, cgroupRoot string) {
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
}

// KubeletDir is kubelet's root directory (--root-dir).
func (n *Node) KubeletDir() string { return filepath.Join(n.Dir, "root") }

// RuncRoot is runc's state directory for the node's containers.
func (n *Node) RuncRoot() string { return filepath.Join(n.Dir, "runc") }

// DevicePluginDir is kubelet's device-plugins directory (kubelet.sock is there). kubelet
// knows only /var/lib/kubelet/device-plugins, whatever its root directory; node.sh
// mounts this one there in the node's mount namespace, so that nodes (and this
// machine) do not share it.
func (n *Node) DevicePluginDir() string { return filepath.Join(n.Dir, "device-plugins") }

// Logs is the end of the node's import, containerd and kubelet logs, for a failure.
func (n *Node) Logs() string {
	var b strings.Builder
	for _, f := range []string{"import.log", "containerd.log", "kubelet.log"} {
		fmt.Fprintf(&b, "--- %s:\n%s\n", f, components.TailFile(filepath.Join(n.Dir, f), 15))
	}
	return b.String()
}

// keepLogs copies the node's logs out of Dir, which cleanup removes, and says where.
func (n *Node) keepLogs(t testing.TB) {
	keep, err := os.MkdirTemp("", "gpurack-hostnode-logs-")
	if err != nil {
		t.Logf("hostnode: logs not kept: %v", err)
		return
	}
	for _, f := range []string{"import.log", "containerd.log", "kubelet.log"} {
		if b, err := os.ReadFile(filepath.Join(n.Dir, f)); err == nil {
			os.WriteFile(filepath.Join(keep, f), b, 0o600)
		}
	}
	t.Logf("hostnode: the test failed; the node's logs are kept in %s", keep)
}

// WaitReady waits for the Node to be Ready and returns it; it fails t with the logs
// when ctx ends first or kubelet or containerd exit.
func (n *Node) WaitReady(t testing.TB, ctx context.Context) *corev1.Node {
	t.Helper()
	for {
		node, err := n.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil && Ready(node) {
			return node
		}
		if ctx.Err() != nil {
			t.Fatalf("node %s not Ready: %v\n%s", n.Name, err, n.Logs())
		}
		select {
		case err := <-n.exited:
			t.Fatalf("containerd or the kubelet exited (%v)\n%s", err, n.Logs())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// RestartKubelet stops kubelet (SIGTERM) and lets node.sh start it again, as
// `systemctl restart kubelet` would.
func (n *Node) RestartKubelet() error {
	if err := os.WriteFile(filepath.Join(n.Dir, "kubelet.restart"), nil, 0o600); err != nil {
		return err
	}
	pids := pidsWithArg("--config=" + filepath.Join(n.Dir, "kubelet.yaml"))
	if len(pids) != 1 {
		return fmt.Errorf("restart kubelet: %d kubelet processes of this node are running (%v), want 1", len(pids), pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop kubelet (pid %d): %w", pids[0], err)
	}
	return nil
}

// Ready reports whether n's Ready condition is True.
func Ready(n *corev1.Node) bool {
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

func restoreSysctls(t testing.TB, m map[string]string) {
	for s, v := range m {
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			t.Logf("restore sysctl %s=%s: %v", s, v, err)
		}
	}
}

// cleanupNode kills everything that ran for the node, by its cgroup and by the
// directory only this node uses (the shims leave the kubelet's process group),
// removes its cgroups and deletes dir.
func cleanupNode(t testing.TB, dir, cgroupRoot string) {
	var sockets []string
	for range 3 {
		pids := pidsIn(cgroupRoot)
		pids = append(pids, pidsWithArg(dir)...)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			// The shims' sockets live in containerd's fixed /run/containerd/s; they
			// are the only unix sockets with a path there in this test's network
			// namespace.
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
	// libcni caches results in /var/lib/cni/results as NETWORK-SANDBOXID-IF, for this
	// node's network and for containerd's own loopback one.
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
	// Directories the kubelet, containerd and libcni create on first use; removed
	// only if nothing else is in them. /var/lib/kubelet/device-plugins stays: it is
	// the mount point of every running node's own directory, and removing it here
	// would unmount it under another test's kubelet.
	for _, d := range []string{"/var/log/containers", "/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"} {
		os.Remove(d)
	}
}

// unixSocketsUnder returns the paths under prefix of the unix sockets in pid's
// network namespace (/proc/PID/net/unix).
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

// pidsWithArg lists processes whose command line mentions s (containerd, its shims,
// the kubelet of a node).
func pidsWithArg(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
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

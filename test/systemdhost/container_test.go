//go:build linux

package systemdhost

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Generous guards for a loaded 2-core host, not performance assertions.
const (
	bootLimit  = 2 * time.Minute // nspawn started to `systemctl is-system-running` = running
	startLimit = 30 * time.Second
)

// containerPath is PATH inside the container (Debian's root PATH).
const containerPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maskedUnits are the node image's services these tests do not need: the agent (it
// would look for GPUs and gpuboot), the container runtime, the kubelet and the image
// import they serve, and networkd (the test sets the container's addresses itself;
// nspawn gives the container no CAP_NET_ADMIN, so networkd would be skipped anyway,
// and masking it keeps network-online.target from waiting on any host). The rig's
// image also serves NFS (nfs-kernel-server, for TestRack's storage host), whose
// filesystems a container cannot mount (nfsd's control filesystem, rpc_pipefs): the
// server and both mounts are masked.
var maskedUnits = []string{
	"gpuagent.service", "containerd.service", "gpurack-images.service", "kubelet.service", "kube-proxy.service",
	"systemd-networkd.service", "systemd-networkd.socket", "systemd-networkd-wait-online.service",
	"nfs-server.service", "proc-fs-nfsd.mount", "run-rpc_pipefs.mount",
}

// bootSpec is what a container boots.
type bootSpec struct {
	// rootfs is the image's rootfs.squashfs: the lower, read-only layer.
	rootfs string
	// dir holds the overlay's upper (the container's writes) and work directories and
	// the mount points. A second boot from the same dir is a power cycle: what the
	// first wrote is still there.
	dir string
	// ns is the network namespace (`ip netns` name) the container runs in.
	ns string
	// binds are read-only bind mounts, host path to container path.
	binds [][2]string
}

// nodeContainer is the node image booted under systemd-nspawn, systemd its PID 1.
// The mounts live in a private mount namespace (unshare) that ends with nspawn, and
// its processes in a PID namespace that ends with the test binary, so nothing is left
// mounted or running on the host, whatever happens to the test.
type nodeContainer struct {
	t    *testing.T
	spec bootSpec
	// pid is the container's PID 1 (systemd) as the host sees it.
	pid int
	// nspawn is unshare, running systemd-nspawn in its mount and PID namespaces.
	nspawn *exec.Cmd
	out    *lockedBuffer // nspawn's console and errors
	exited chan struct{} // closed when nspawn (unshare) has exited
}

// bootContainer boots spec and waits until systemd reports the system running. The
// container is killed in t.Cleanup; a failed test first gets the journal's tail.
func bootContainer(t *testing.T, spec bootSpec) *nodeContainer {
	t.Helper()
	c := &nodeContainer{t: t, spec: spec}
	c.start()
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpJournal()
		}
		c.kill()
	})
	c.waitRunning()
	return c
}

// start starts nspawn on spec and finds the container's PID 1.
func (c *nodeContainer) start() {
	t := c.t
	t.Helper()
	s := c.spec
	for _, d := range []string{"lower", "upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{
		"-D", filepath.Join(s.dir, "root"), "--boot", "--register=no", "--keep-unit", "--console=pipe",
		"--network-namespace-path=/run/netns/" + s.ns, "--machine=gpurack-node",
	}
	for _, b := range s.binds {
		args = append(args, "--bind-ro="+b[0]+":"+b[1])
	}
	args = append(args, "--")
	for _, u := range maskedUnits {
		args = append(args, "systemd.mask="+u)
	}
	// nspawn refuses to work under a /run/systemd/nspawn on disk (a host whose /run is
	// no tmpfs: "Attempted to remove disk file system under /run/systemd/nspawn"),
	// hence the tmpfs, private to this mount namespace like the image's mounts.
	script := `set -e
mount -t squashfs -o ro "$1" "$2/lower"
mount -t overlay overlay -o "lowerdir=$2/lower,upperdir=$2/upper,workdir=$2/work" "$2/root"
mkdir -p /run/systemd/nspawn
mount -t tmpfs tmpfs /run/systemd/nspawn
shift 2
exec systemd-nspawn "$@"`
	// A PID namespace of its own, whose first process (nspawn) gets SIGKILL when
	// unshare dies (--kill-child), and unshare when the test binary does (Pdeathsig):
	// the kernel then kills every process of the namespace, the container's among
	// them. Without it a container outlives a test binary killed by a timeout, since
	// the container's PID 1 survives nspawn.
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
		"--", "sh", "-c", script, "sh", s.rootfs, s.dir}, args...)...)
	c.out = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start systemd-nspawn: %v", err)
	}
	c.nspawn, c.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(c.exited) }()
	deadline := time.Now().Add(startLimit)
	for c.pid == 0 {
		select {
		case <-c.exited:
			t.Fatalf("systemd-nspawn exited (%v) before the container's systemd started:\n%s", cmd.ProcessState, c.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		c.pid = descendantNamed(cmd.Process.Pid, "systemd")
		if c.pid == 0 && time.Now().After(deadline) {
			c.kill()
			t.Fatalf("no systemd started under systemd-nspawn (unshare pid %d) in %s:\n%s", cmd.Process.Pid, startLimit, c.out.String())
		}
	}
}

// waitRunning waits until `systemctl is-system-running` says running: every unit of
// the boot started, none failed.
func (c *nodeContainer) waitRunning() {
	t := c.t
	t.Helper()
	start := time.Now()
	var state string
	for time.Since(start) < bootLimit {
		out, _ := c.output("systemctl", "is-system-running", "--wait")
		state = strings.TrimSpace(out)
		switch state {
		case "running":
			t.Logf("container (PID 1 %d) booted to running in %s", c.pid, time.Since(start).Round(time.Millisecond))
			return
		case "degraded":
			failed, _ := c.output("systemctl", "list-units", "--failed", "--no-pager")
			t.Fatalf("the node image booted degraded under systemd-nspawn:\n%s", failed)
		}
		select { // systemd not answering on its bus yet
		case <-c.exited:
			t.Fatalf("systemd-nspawn exited (%v) while the container booted:\n%s", c.nspawn.ProcessState, c.out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("the container is not running after %s (last state %q)", bootLimit, state)
}

// powerCycle kills the container and boots it again from the same overlay: a
// machine's power cut and power on, with its disk as it was.
func (c *nodeContainer) powerCycle() {
	c.t.Helper()
	c.kill()
	c.pid = 0
	c.start()
	c.waitRunning()
}

// kill ends the container: SIGKILL to its PID 1 ends every process of its PID
// namespace, nspawn then exits, and with it the mount namespace holding its mounts.
func (c *nodeContainer) kill() {
	if c.nspawn == nil {
		return
	}
	if c.pid > 0 {
		syscall.Kill(c.pid, syscall.SIGKILL)
	} else {
		syscall.Kill(-c.nspawn.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		syscall.Kill(-c.nspawn.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
	c.nspawn = nil
}

// dumpJournal logs the end of the container's journal and nspawn's output.
func (c *nodeContainer) dumpJournal() {
	if c.nspawn == nil || c.pid == 0 {
		return
	}
	out, _ := c.output("journalctl", "--boot", "--no-pager", "--lines=150")
	c.t.Logf("the container's journal, last lines:\n%s\nsystemd-nspawn's output:\n%s", out, lastLines(c.out.String(), 40))
}

// command runs name inside the container: every namespace of its PID 1, and an
// environment of its own (PATH, HOME) rather than the test's.
func (c *nodeContainer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	a := append([]string{"--target", strconv.Itoa(c.pid), "--all", "--", "env", "-i", "PATH=" + containerPath, "HOME=/root", "LANG=C.UTF-8", name}, args...)
	return exec.CommandContext(ctx, "nsenter", a...)
}

// output runs name in the container (for at most a minute) and returns its combined
// output; the error names the command and holds the output.
func (c *nodeContainer) output(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in the container: %s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// run is output that fails the test on an error.
func (c *nodeContainer) run(name string, args ...string) string {
	c.t.Helper()
	out, err := c.output(name, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// path is the host's path of path inside the container (through /proc/PID/root).
func (c *nodeContainer) path(path string) string {
	return filepath.Join("/proc", strconv.Itoa(c.pid), "root", path)
}

// writeFile writes data to path inside the container, making its directory.
func (c *nodeContainer) writeFile(path string, data []byte, mode os.FileMode) {
	c.t.Helper()
	p := c.path(path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		c.t.Fatal(err)
	}
}

// unitProps reads properties of unit (systemctl show), by name.
func (c *nodeContainer) unitProps(unit string, names ...string) map[string]string {
	c.t.Helper()
	out := c.run("systemctl", "show", unit, "--property="+strings.Join(names, ","))
	props := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			props[k] = v
		}
	}
	return props
}

// waitUnit polls unit's properties until cond holds, failing after limit, or once
// the unit has failed, with the last ones read, what was awaited and its status.
func (c *nodeContainer) waitUnit(unit, what string, limit time.Duration, cond func(map[string]string) bool, names ...string) map[string]string {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		p := c.unitProps(unit, names...)
		if cond(p) {
			return p
		}
		// failed is final: systemd gave up (no Restart=, or its limit hit).
		if p["ActiveState"] == "failed" || time.Now().After(deadline) {
			st, _ := c.output("systemctl", "status", "--no-pager", "--lines=30", unit)
			c.t.Fatalf("%s: not %s after %s (%v):\n%s", unit, what, limit, p, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// descendantNamed is the nearest descendant of pid whose command name is name, or 0.
func descendantNamed(pid int, name string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	children, comm := map[int][]int{}, map[int]string{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], p)
		comm[p] = s[open+1 : end]
	}
	for queue := append([]int(nil), children[pid]...); len(queue) > 0; queue = queue[1:] {
		if comm[queue[0]] == name {
			return queue[0]
		}
		queue = append(queue, children[queue[0]]...)
	}
	return 0
}

// lockedBuffer is a bytes.Buffer safe for a process's output and a reader at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

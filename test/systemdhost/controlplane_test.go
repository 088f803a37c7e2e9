//go:build linux

package systemdhost

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/test/rigimage"
)

// The control plane in the container: docs/controlplane.md's quick start, without
// --foreground, so that init installs systemd units.
const (
	clusterDir = "/var/lib/gpurack/cluster"
	kubectl    = "/root/.cache/gpurack/k8s/" + components.PinnedVersion + "/bin/kubectl"
	// readyLimit bounds how long kube-apiserver may take to answer /readyz after a
	// start or restart.
	readyLimit = 2 * time.Minute
)

var apiserverUnit = components.UnitName(components.APIServer)

// TestControlPlaneUnits runs `controlplane-bootstrap init` without --foreground in
// the node image booted with systemd as PID 1, so that it writes, enables and starts
// the control plane's units over D-Bus, and checks them: each active and enabled,
// etcd ready before kube-apiserver starts, /readyz with admin.conf, a killed
// kube-apiserver restarted by systemd and ready again, its log in the journal, init
// run again on the running units, and after a power cycle of the container, the
// enabled units started by the boot in the same order and ready.
func TestControlPlaneUnits(t *testing.T) {
	requireHost(t)
	testcluster.Require(t)
	bins := rigimage.BuildBinaries(t)
	image, _ := nodeImage(t, bins)
	root := repoRoot(t)

	env := netnstest.New(t)
	ns := env.Namespace()
	// The repository's paths the quick start names, and the pinned binaries where
	// controlplane-bootstrap looks for them by default (root's cache).
	src := stageTree(t, map[string]string{
		"bin/controlplane-bootstrap": bins.ControlPlane,
		"docs/examples/cluster.yaml": filepath.Join(root, "docs", "examples", "cluster.yaml"),
	})
	c := bootContainer(t, bootSpec{
		rootfs: filepath.Join(image, "rootfs.squashfs"), dir: t.TempDir(), ns: ns,
		binds: [][2]string{{src, "/root/gpurack"}, {components.BinDir(""), filepath.Dir(kubectl)}},
	})

	start := time.Now()
	out := c.run("bash", "-c", "cd /root/gpurack && bin/controlplane-bootstrap init --config docs/examples/cluster.yaml --dir "+clusterDir)
	t.Logf("controlplane-bootstrap init (systemd units) in %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	checkUnitsRunning(t, c)
	checkStartOrder(t, c)
	checkReady(t, c)
	checkSandbox(t, c)
	checkAPIServerRestart(t, c)

	// init again leaves running units running and re-applies the join material.
	if out, err := c.output("/root/gpurack/bin/controlplane-bootstrap", "init", "--dir", clusterDir); err != nil || !strings.Contains(out, "already running") {
		t.Errorf("init again on the running units: %v; want it to say the control plane is already running:\n%s", err, out)
	}
	if out := c.run("/root/gpurack/bin/controlplane-bootstrap", "status", "--dir", clusterDir); !strings.Contains(out, "systemd units") {
		t.Errorf("status does not name the systemd units:\n%s", out)
	}

	start = time.Now()
	c.powerCycle()
	checkUnitsRunning(t, c)
	checkStartOrder(t, c)
	checkReady(t, c)
	t.Logf("power cycle: the boot started the control plane's units, ready in %s", time.Since(start).Round(time.Millisecond))
}

// checkUnitsRunning waits for each component's unit to be active and running, and
// checks it is the file init wrote, enabled.
func checkUnitsRunning(t *testing.T, c *nodeContainer) {
	t.Helper()
	for _, name := range components.Names {
		unit := components.UnitName(name)
		p := c.waitUnit(unit, "active (running)", startLimit, func(p map[string]string) bool {
			return p["ActiveState"] == "active" && p["SubState"] == "running"
		}, "ActiveState", "SubState", "UnitFileState", "FragmentPath")
		if p["UnitFileState"] != "enabled" || p["FragmentPath"] != "/etc/systemd/system/"+unit {
			t.Errorf("%s: %v, want enabled, from /etc/systemd/system", unit, p)
		}
	}
}

// checkStartOrder checks that each component's process started only once the one
// before it was active: etcd (Type=notify: active once it is ready) before
// kube-apiserver, and so on.
func checkStartOrder(t *testing.T, c *nodeContainer) {
	t.Helper()
	prevActive, prev := uint64(0), ""
	for _, name := range components.Names {
		unit := components.UnitName(name)
		p := c.unitProps(unit, "ActiveEnterTimestampMonotonic", "ExecMainStartTimestampMonotonic")
		active, err1 := strconv.ParseUint(p["ActiveEnterTimestampMonotonic"], 10, 64)
		started, err2 := strconv.ParseUint(p["ExecMainStartTimestampMonotonic"], 10, 64)
		if err1 != nil || err2 != nil || active == 0 || started == 0 {
			t.Fatalf("%s: start times %v", unit, p)
		}
		if started < prevActive {
			t.Errorf("%s started %d µs before %s was active: the units do not order the start", unit, prevActive-started, prev)
		}
		t.Logf("%s: started at %d µs, active at %d µs (monotonic)", unit, started, active)
		prevActive, prev = active, unit
	}
}

// checkReady waits for kube-apiserver's /readyz to answer ok to admin.conf.
func checkReady(t *testing.T, c *nodeContainer) {
	t.Helper()
	deadline := time.Now().Add(readyLimit)
	for {
		out, err := c.output(kubectl, "--kubeconfig", clusterDir+"/admin.conf", "--request-timeout=5s", "get", "--raw", "/readyz")
		if err == nil && strings.TrimSpace(out) == "ok" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver /readyz not ok after %s: %v", readyLimit, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkAPIServerRestart kills kube-apiserver (SIGKILL, a crash) and waits for systemd
// to restart it and for it to be ready again; its log is in the journal.
func checkAPIServerRestart(t *testing.T, c *nodeContainer) {
	t.Helper()
	before := c.unitProps(apiserverUnit, "MainPID", "NRestarts", "RestartUSec")
	pid := before["MainPID"]
	n, _ := strconv.Atoi(before["NRestarts"])
	killed := time.Now()
	c.run("bash", "-c", "kill -KILL "+pid)
	c.waitUnit(apiserverUnit, "restarted", 30*time.Second, func(p map[string]string) bool {
		return p["NRestarts"] == strconv.Itoa(n+1) && p["ActiveState"] == "active" && p["MainPID"] != pid && p["MainPID"] != "0"
	}, "NRestarts", "ActiveState", "MainPID")
	checkReady(t, c)
	t.Logf("kube-apiserver killed (pid %s): restarted (RestartSec %s) and ready again after %s", pid, before["RestartUSec"], time.Since(killed).Round(time.Millisecond))
	log := c.run("journalctl", "--no-pager", "-u", apiserverUnit)
	for _, want := range []string{"Serving securely on", "status=9/KILL"} {
		if !strings.Contains(log, want) {
			t.Errorf("journalctl -u %s has no %q line:\n%s", apiserverUnit, want, lastLines(log, 30))
		}
	}
}

// checkSandbox checks the control-plane units' hardening (decision 0690) on each running
// component: no capability at all though it runs as root, no new privileges, a seccomp
// filter, and a mount namespace where / and /usr are read-only and the cluster
// directory writable.
func checkSandbox(t *testing.T, c *nodeContainer) {
	t.Helper()
	for _, unit := range []string{"gpurack-etcd.service", apiserverUnit, "gpurack-kube-controller-manager.service", "gpurack-kube-scheduler.service"} {
		pid := c.unitProps(unit, "MainPID")["MainPID"]
		status := procStatus(t, c, pid)
		for field, want := range map[string]string{"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
			if status[field] != want {
				t.Errorf("%s (pid %s) %s: %q, want %q (/proc/PID/status)", unit, pid, field, status[field], want)
			}
		}
		mounts := mountOptions(t, c.run("cat", "/proc/"+pid+"/mountinfo"))
		for _, m := range []struct{ point, want string }{{"/", "ro"}, {"/usr", "ro"}, {"/etc", "ro"}, {clusterDir, "rw"}} {
			if got := mounts.optionAt(m.point); got != m.want {
				t.Errorf("%s's mount namespace: %s is %q, want %q", unit, m.point, got, m.want)
			}
		}
	}
}

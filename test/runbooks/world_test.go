package runbooks

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// gpubootName and gpubootAddr are gpuboot's name in every site's /etc/hosts and the
// address it stands for, on the world's loopback device: the document's example values
// work as written.
const (
	gpubootName = "gpuboot.example"
	gpubootAddr = "192.0.2.1"
)

// binaries are the commands built from this tree, with the stand-ins for systemd beside
// them, and the pinned Kubernetes binaries.
type binaries struct {
	root   string // the module's root
	bin    string // gpuboot, gpuimage, gpuagent, controlplane-bootstrap, systemctl, journalctl
	k8sDir string // GPURACK_K8S_DIR
}

// world is what a runbook runs against: a network namespace (loopback, and gpuboot's
// address) with a control plane in it. Each runbook runs in a site of its own
// (site_test.go), a mount namespace in a world's network namespace; runbooks that run at
// the same time run in different worlds, so the document's fixed ports do not collide.
type world struct {
	*binaries
	t          *testing.T
	env        *netnstest.Env
	ns         string
	clusterDir string // /var/lib/gpurack/cluster in the world's sites
	cluster    *site  // the control-plane host
}

// buildBinaries checks for what the runbooks need and builds the commands; they go
// when t ends.
func buildBinaries(t *testing.T) *binaries {
	netnstest.Require(t)
	testcluster.Require(t, "kubectl")
	for _, tool := range []string{"unshare", "nsenter", "mount", "bash", "jq", "openssl", "curl", "mksquashfs", "systemd-sysusers", "runuser", "setpriv", "go"} {
		testreq.Tool(t, tool, "apt-get install util-linux mount bash jq openssl curl squashfs-tools systemd; hack/deps.sh installs them")
	}
	if fs, _ := os.ReadFile("/proc/filesystems"); !strings.Contains(string(fs), "\toverlay\n") {
		testreq.Missing(t, "the kernel has no overlay filesystem, which the sites use to add /etc/gpurack and the like without touching the host's /etc", "modprobe overlay")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// The binaries' directory is one the user gpuboot can reach: t.TempDir's parent is
	// root's alone.
	bin, err := os.MkdirTemp("", "runbooks-bin-")
	if err == nil {
		err = os.Chmod(bin, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	b := &binaries{root: root, bin: bin, k8sDir: filepath.Dir(components.BinDir(""))}
	b.build(t)
	return b
}

// build compiles the four commands into b.bin and writes the stand-ins beside them.
func (b *binaries) build(t *testing.T) {
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", b.bin+"/", "./pxe/cmd/gpuboot", "./imagebuilder/cmd/gpuimage",
		"./agent/cmd/gpuagent", "./controlplane-bootstrap/cmd/controlplane-bootstrap")
	cmd.Dir = b.root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for name, text := range map[string]string{"systemctl": systemctlStandIn, "journalctl": journalctlStandIn} {
		if err := os.WriteFile(filepath.Join(b.bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("built gpuboot, gpuimage, gpuagent and controlplane-bootstrap in %.1f s", time.Since(start).Seconds())
}

// newWorld makes a network namespace with gpuboot's address and starts its control
// plane, as on the control-plane host: `controlplane-bootstrap init --foreground` with
// /var/lib/gpurack/cluster as its directory, in a site of its own. The world's other
// sites see the same directory. Everything stops and goes when t ends.
func newWorld(t *testing.T, b *binaries) *world {
	w := &world{binaries: b, t: t, clusterDir: t.TempDir()}
	w.env = netnstest.New(t)
	w.ns = w.env.Namespace()
	if out, err := w.env.Run(w.ns, "ip", "addr", "add", gpubootAddr+"/32", "dev", "lo"); err != nil {
		t.Fatalf("add %s to the world's loopback: %v\n%s", gpubootAddr, err, out)
	}
	w.cluster = w.newSite(t, "control-plane", false)
	w.cluster.startControlPlane(0)
	return w
}

// startControlPlane starts a control plane in s, on the default ports shifted by
// shift, with /var/lib/gpurack/cluster as its directory; it stops when s's test ends.
func (s *site) startControlPlane(shift int) {
	start := time.Now()
	cfg := clusterconfig.Default()
	cfg.APIServer.Port += shift
	cfg.APIServer.Endpoint = fmt.Sprintf("127.0.0.1:%d", cfg.APIServer.Port)
	cfg.Etcd.ClientPort, cfg.Etcd.PeerPort, cfg.Etcd.MetricsPort = cfg.Etcd.ClientPort+shift, cfg.Etcd.PeerPort+shift, cfg.Etcd.MetricsPort+shift
	cfg.ControllerManager.Port, cfg.Scheduler.Port = cfg.ControllerManager.Port+shift, cfg.Scheduler.Port+shift
	// The cluster's data need not survive a power loss, and fsync is the slowest part of
	// etcd on a shared disk.
	cfg.Etcd.ExtraArgs = map[string]string{"unsafe-no-fsync": "true"}
	data, err := cfg.Marshal()
	if err != nil {
		s.t.Fatal(err)
	}
	s.writeFile("/etc/gpurack/cluster.yaml", string(data), 0o644)
	s.runControlPlane()
	s.t.Logf("control plane (API port %d) ready in %.1f s", cfg.APIServer.Port, time.Since(start).Seconds())
}

// runControlPlane runs `controlplane-bootstrap init --foreground` with the site's
// /etc/gpurack/cluster.yaml and /var/lib/gpurack/cluster until it is ready, and stops it
// when the test ends.
func (s *site) runControlPlane() {
	cmd := s.command("controlplane-bootstrap", "init", "--foreground", "--config", "/etc/gpurack/cluster.yaml", "--dir", "/var/lib/gpurack/cluster")
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { stopGently(cmd, time.Minute) })
	log := filepath.Join(s.run, fmt.Sprintf("controlplane-%d.log", cmd.Process.Pid))
	if err := waitForLine(out, log, "ready in ", 4*time.Minute); err != nil {
		s.t.Fatalf("the control plane did not start: %v (log: %s)\n%s", err, log, tail(log))
	}
}

// waitForLine copies r to the file log until a line starts with prefix, which it
// waits for at most d; the copy goes on after it returns.
func waitForLine(r io.Reader, log, prefix string, d time.Duration) error {
	f, err := os.Create(log)
	if err != nil {
		return err
	}
	found := make(chan bool, 1)
	go func() {
		defer f.Close()
		sc := bufio.NewScanner(r)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(f, sc.Text())
			if !seen && strings.HasPrefix(sc.Text(), prefix) {
				seen = true
				found <- true
			}
		}
		if !seen {
			found <- false
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			return fmt.Errorf("it exited without printing %q", prefix)
		}
		return nil
	case <-time.After(d):
		return fmt.Errorf("no line %q after %s", prefix, d)
	}
}

// stopGently sends cmd SIGTERM and waits up to d before netnstest's cleanup kills its
// process group.
func stopGently(cmd *exec.Cmd, d time.Duration) {
	if cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

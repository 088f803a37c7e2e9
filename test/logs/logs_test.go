// Package logs tests the log store as `controlplane-bootstrap init` starts it
// (monitoring.logs, docs/monitoring.md "Logs", docs/contracts.md §15): the real
// controlplane-bootstrap binary built from this tree runs `init --foreground` with
// monitoring on, which starts the pinned victoria-logs and the gateway (the same
// binary's logs-gateway subcommand); clients with certificates of the cluster's own CA
// post lines through the gateway, and the `logs` command reads them back.
package logs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// controlPlane is a running `init --foreground` with the log store.
type controlPlane struct {
	bin, dir string
	cfg      *clusterconfig.Config
	promURL  string
	// gw is the gateway's base URL, set the cluster's PKI (for client certificates).
	gw  string
	set *clusterpki.Set
}

// buildCLI builds controlplane-bootstrap from this tree into dir.
func buildCLI(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "controlplane-bootstrap")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/gpurack/gpurack/controlplane-bootstrap/cmd/controlplane-bootstrap")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build controlplane-bootstrap: %v\n%s", err, out)
	}
	return bin
}

// startControlPlane writes cluster.yaml (free loopback ports, monitoring on, the log
// store with a 7d retention and a 1GiB disk bound, scrapes every second) and runs
// init --foreground until it reports ready; t.Cleanup stops it.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	work := t.TempDir()
	bin := buildCLI(t, work)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := testcluster.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Monitoring.Enabled = true
	cfg.Monitoring.Prometheus.Port, cfg.Monitoring.Alertmanager.Port = ports[0], ports[1]
	cfg.Monitoring.KubeStateMetrics.Port, cfg.Monitoring.KubeStateMetrics.TelemetryPort = ports[2], ports[3]
	cfg.Monitoring.Prometheus.ScrapeInterval, cfg.Monitoring.Prometheus.EvaluationInterval = "1s", "1s"
	cfg.Monitoring.Logs.RetentionPeriod, cfg.Monitoring.Logs.MaxDiskSpaceUsage = "7d", "1GiB"
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(work, "cluster.yaml")
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "cluster")
	cmd := exec.Command(bin, "init", "--foreground", "--config", cfgPath, "--dir", dir)
	out := &syncBuffer{}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "ready in ") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			t.Errorf("init --foreground did not stop within 60 s of SIGTERM")
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("init --foreground:\n%s", out.String())
			for _, f := range []string{"victoria-logs.log", "logs-gateway.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, "logs", f))
				t.Logf("%s:\n%s", f, tail(string(b), 30))
			}
		}
	})
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("init --foreground exited: %v\n%s", err, out.String())
	case <-time.After(4 * time.Minute):
		t.Fatalf("init --foreground not ready after 4 minutes:\n%s", out.String())
	}
	return &controlPlane{bin: bin, dir: dir, cfg: cfg, promURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0])}
}

// cli runs the built controlplane-bootstrap with args.
func (c *controlPlane) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.bin, args...).CombinedOutput()
	t.Logf("$ controlplane-bootstrap %s\n%s", strings.Join(args, " "), tail(string(out), 20))
	return string(out), err
}

// logs runs the logs command on the control plane's directory.
func (c *controlPlane) logs(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.cli(t, append([]string{"logs", "--dir", c.dir}, args...)...)
	if err != nil {
		t.Fatalf("logs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// eventually retries check every 250 ms until it passes or d is over.
func eventually(t *testing.T, d time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) WriteString(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(v)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

package node

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/registryhosts"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// lockedBuffer is a log sink the service's goroutine and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runRegistryHosts runs the registry-hosts service for bundle until it says Running,
// and returns its status message and log; it stops the service before it returns.
func runRegistryHosts(t *testing.T, dir string, bundle *bootv1.JoinBundle) (string, string) {
	t.Helper()
	var logs lockedBuffer
	cfg := simConfig(t)
	cfg.RegistryHostsDir = dir
	n := &node{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil))}
	svc := n.registryHosts(bundle)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.attempt(ctx, gated{}) }()
	deadline := time.Now().Add(10 * time.Second)
	for svc.Status().State != Running {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("registry-hosts ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry-hosts not running after 10 s: %+v", svc.Status())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("registry-hosts after stop: %v", err)
	}
	return svc.Status().Message, logs.String()
}

// The service writes the bundle's registry's hosts.toml with the bundle's cluster CA
// beside it, and with a bundle that names no registry removes it and says so once.
func TestRegistryHostsService(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	caPEM := string(pki.EncodeCertPEM(ca.Cert))
	dir := filepath.Join(t.TempDir(), "certs.d")
	msg, logs := runRegistryHosts(t, dir, &bootv1.JoinBundle{NodeName: "gpu-1", ClusterCaPem: caPEM, Registry: "10.0.0.2:5000"})
	hosts := filepath.Join(dir, "10.0.0.2:5000", registryhosts.HostsFile)
	if !strings.Contains(msg, "containerd trusts 10.0.0.2:5000") || !strings.Contains(logs, "containerd trusts the cluster registry") {
		t.Errorf("status %q, log:\n%s", msg, logs)
	}
	caFile := filepath.Join(dir, "10.0.0.2:5000", registryhosts.CAFile)
	if b, err := os.ReadFile(caFile); err != nil || string(b) != caPEM {
		t.Errorf("%s: %v; want the bundle's cluster CA", caFile, err)
	}
	if b, err := os.ReadFile(hosts); err != nil || string(b) != string(registryhosts.HostsTOML("10.0.0.2:5000", caFile)) {
		t.Errorf("%s: %q, %v", hosts, b, err)
	}

	msg, logs = runRegistryHosts(t, dir, &bootv1.JoinBundle{NodeName: "gpu-1", ClusterCaPem: caPEM})
	if msg != "no registry in the JoinBundle" || strings.Count(logs, "no registry in the JoinBundle") != 1 ||
		!strings.Contains(logs, "no longer names") {
		t.Errorf("no registry: status %q, log:\n%s", msg, logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "10.0.0.2:5000")); !os.IsNotExist(err) {
		t.Errorf("the stale registry folder is still there: %v", err)
	}
}

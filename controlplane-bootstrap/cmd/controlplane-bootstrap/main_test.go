package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The test binary doubles as the command: with this variable set, TestMain
// runs main() instead of the tests, so the tests drive the real CLI in a
// child process without a separate build.
const runMainEnv = "CONTROLPLANE_BOOTSTRAP_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	// The tenants and users tests share one control plane (started on
	// first use); testcluster.Main stops it.
	os.Exit(testcluster.Main(m))
}

func cli(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	t.Logf("$ controlplane-bootstrap %s\n%s", strings.Join(args, " "), out)
	return string(out), err
}

// startForeground runs `init --foreground` and returns once it reports
// ready, with a channel that delivers its exit; t.Cleanup stops it if it is
// still running.
func startForeground(t *testing.T, args ...string) <-chan error {
	t.Helper()
	return startForegroundCmd(t, append([]string{"init", "--foreground"}, args...)...)
}

// startForegroundCmd runs the command args (init or join, with --foreground) as
// startForeground does.
func startForegroundCmd(t *testing.T, args ...string) <-chan error {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); pw.Close(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	ready := make(chan string, 1)
	var log bytes.Buffer
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "ready in ") {
				ready <- sc.Text()
			}
		}
		io.Copy(io.Discard, pr)
	}()
	logText := func() string { mu.Lock(); defer mu.Unlock(); return log.String() }
	select {
	case line := <-ready:
		t.Logf("%s --foreground: %s", args[0], line)
	case <-exited:
		t.Fatalf("%s --foreground exited: %v\n%s", args[0], waitErr, logText())
	case <-time.After(4 * time.Minute):
		t.Fatalf("%s --foreground not ready after 4 minutes\n%s", args[0], logText())
	}
	done := make(chan error, 1)
	go func() { <-exited; done <- waitErr }()
	return done
}

func TestCLIEndToEnd(t *testing.T) {
	testcluster.Require(t)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Etcd.ExtraArgs = nil
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	cfgPath := filepath.Join(work, "cluster.yaml")
	os.WriteFile(cfgPath, data, 0o644)
	dir := filepath.Join(work, "cluster")

	fg := startForeground(t, "--config", cfgPath, "--dir", dir)

	out, err := cli(t, "", "status", "--dir", dir)
	if err != nil || strings.Count(out, " ok ") != 4 || !strings.Contains(out, "foreground (supervisor pid") {
		t.Fatalf("status: %v", err)
	}
	tokenRE := regexp.MustCompile(`(?m)^([a-z0-9]{6})\.[a-z0-9]{16}$`)
	out, err = cli(t, "", "token", "create", "--dir", dir, "--ttl", "1h", "--description", "kept")
	kept := tokenRE.FindStringSubmatch(out)
	if err != nil || kept == nil {
		t.Fatalf("token create: %v", err)
	}
	out, err = cli(t, "", "token", "create", "--dir", dir)
	revoked := tokenRE.FindStringSubmatch(out)
	if err != nil || revoked == nil {
		t.Fatalf("token create: %v", err)
	}
	out, err = cli(t, "", "token", "list", "--dir", dir)
	if err != nil || !strings.Contains(out, kept[1]) || !strings.Contains(out, revoked[1]) || !strings.Contains(out, "authentication,signing") {
		t.Fatalf("token list: %v", err)
	}
	if out, err = cli(t, "", "token", "revoke", "--dir", dir, revoked[1]); err != nil || !strings.Contains(out, "revoked") {
		t.Fatalf("token revoke: %v", err)
	}
	if out, err = cli(t, "", "token", "revoke", "--dir", dir, revoked[1]); err == nil || !strings.Contains(out, "no such bootstrap token") {
		t.Errorf("revoking it again: %v", err)
	}
	if out, _ = cli(t, "", "token", "list", "--dir", dir); strings.Contains(out, revoked[1]) {
		t.Error("revoked token still listed")
	}

	joinOut := filepath.Join(work, "join")
	if _, err := cli(t, "", "join-config", "--dir", dir, "--out", joinOut); err != nil {
		t.Fatalf("join-config: %v", err)
	}
	kc, err := clientcmd.LoadFromFile(filepath.Join(joinOut, "enroller.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	if kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server != cfg.EndpointURL() {
		t.Errorf("enroller kubeconfig server %v", kc.Clusters)
	}

	checkAuditBreakGlass(t, dir)

	caBefore, _ := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if out, err = cli(t, "", "init", "--config", cfgPath, "--dir", dir, "--foreground"); err != nil || !strings.Contains(out, "already running") {
		t.Errorf("init while running: %v", err)
	}

	if _, err := cli(t, "", "stop", "--dir", dir); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case err := <-fg:
		if err != nil {
			t.Errorf("init --foreground after stop: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("init --foreground still running after stop")
	}
	if out, err = cli(t, "", "status", "--dir", dir); err == nil || !strings.Contains(out, "stopped") {
		t.Errorf("status after stop: %v", err)
	}

	// Start again from the directory alone: same CA, same data.
	startForeground(t, "--dir", dir)
	caAfter, _ := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if !bytes.Equal(caBefore, caAfter) {
		t.Error("the second init replaced the cluster CA")
	}
	if out, err = cli(t, "", "token", "list", "--dir", dir); err != nil || !strings.Contains(out, kept[1]) {
		t.Errorf("token %s did not survive stop and init: %v", kept[1], err)
	}

	if out, err = cli(t, "no\n", "reset", "--dir", dir); err == nil || !strings.Contains(out, "Type 'yes'") {
		t.Errorf("reset answered no: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pki", "ca.crt")); err != nil {
		t.Fatal("reset deleted the cluster although the answer was no")
	}
	if _, err = cli(t, "", "reset", "--dir", dir, "--yes"); err != nil {
		t.Fatalf("reset --yes: %v", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("reset --yes left the directory")
	}
}

func TestCLIBadConfigNamesField(t *testing.T) {
	work := t.TempDir()
	bad := filepath.Join(work, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: gpurack.io/v1alpha1\nkind: ClusterConfig\napiServer:\n  port: 99999\n  advertiseAdress: 10.0.0.1\n"), 0o644)
	out, err := cli(t, "", "init", "--config", bad, "--dir", filepath.Join(work, "c"), "--foreground")
	if err == nil {
		t.Fatal("init accepted a bad config")
	}
	for _, want := range []string{bad + ":5: apiServer.advertiseAdress: unknown field"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	os.WriteFile(bad, []byte("apiServer:\n  port: 99999\n"), 0o644)
	out, _ = cli(t, "", "init", "--config", bad, "--dir", filepath.Join(work, "c"), "--foreground")
	if !strings.Contains(out, bad+":2: apiServer.port: 99999 is not a port") {
		t.Errorf("output lacks the port error")
	}
	if _, err := os.Stat(filepath.Join(work, "c")); err == nil {
		t.Error("a bad config still created the cluster directory")
	}
	if out, err := cli(t, "", "reset", "--dir", work, "--yes"); err == nil || !strings.Contains(out, "does not look like a cluster directory") {
		t.Errorf("reset of a non-cluster directory: %v", err)
	}
}

func TestCLIWithoutSystemdSaysForeground(t *testing.T) {
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		testreq.NotApplicable(t, "this host runs systemd; the unit path would really start units")
	}
	testcluster.Require(t)
	cfg, _ := testcluster.Config()
	data, _ := cfg.Marshal()
	work := t.TempDir()
	os.WriteFile(filepath.Join(work, "c.yaml"), data, 0o644)
	out, err := cli(t, "", "init", "--config", filepath.Join(work, "c.yaml"), "--dir", filepath.Join(work, "c"))
	if err == nil || !strings.Contains(out, "--foreground") {
		t.Errorf("init without --foreground on a host without systemd: %v", err)
	}
}

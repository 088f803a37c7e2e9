package node

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
)

// TestLocalSocketIsRootOnly: the local socket has no authentication, so its mode is
// its guard. Even under umask 0 the directory the agent makes is 0700 and the socket
// 0600, with nothing left of the private directory it was bound in; a stale socket is
// replaced, a file that is not a socket is not.
func TestLocalSocketIsRootOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	path := filepath.Join(dir, "agent.sock")
	old := syscall.Umask(0)
	l, err := listenUnix(path)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory: %v %v, want mode 0700", fi.Mode(), err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v, want a socket with mode 0600", fi.Mode(), err)
	}
	if l.Addr().String() != path {
		t.Errorf("listener address %s, want %s (logs and status name it)", l.Addr(), path)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("socket directory holds %d entries, want the socket alone", len(ents))
	}
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("the renamed socket does not accept: %v", err)
	}
	c.Close()
	l.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("closing the listener removed %s: the stop path (grpcService) owns that: %v", path, err)
	}
	l, err = listenUnix(path) // the stale socket is replaced
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	l.Close()
	if w := openDirWarning(path); w != "" {
		t.Errorf("warning for a 0700 directory: %s", w)
	}

	open := t.TempDir()
	os.Chmod(open, 0o755)
	if w := openDirWarning(filepath.Join(open, "agent.sock")); !strings.Contains(w, "chmod 0700") {
		t.Errorf("no warning for a 0755 socket directory: %q", w)
	}
	file := filepath.Join(open, "agent.sock")
	os.WriteFile(file, []byte("not a socket"), 0o600)
	if _, err := listenUnix(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("a regular file at --socket: %v", err)
	}
}

func TestInsecureAddressAllowed(t *testing.T) {
	for _, tt := range []struct {
		listen string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:50051", false, true},
		{"[::1]:50051", false, true},
		{"localhost:50051", false, true},
		{"127.8.9.10:50051", false, true},
		{":50051", false, false}, // every address
		{"0.0.0.0:50051", false, false},
		{"[::]:50051", false, false},
		{"10.0.0.7:50051", false, false},
		{"node-a:50051", false, false},
		{":50051", true, true},
		{"10.0.0.7:50051", true, true},
		{"no-port", true, false},
	} {
		err := insecureAddressAllowed(tt.listen, tt.remote)
		if (err == nil) != tt.ok {
			t.Errorf("insecureAddressAllowed(%q, %v) = %v", tt.listen, tt.remote, err)
		}
		if err != nil && tt.listen != "no-port" && !strings.Contains(err.Error(), "--insecure-unauthenticated-remote") {
			t.Errorf("refusal of %q does not name the flag that accepts the risk: %v", tt.listen, err)
		}
	}
}

// TestInsecureRefusesTheNetwork: a node with --insecure on every address does not
// start (and listens on nothing); on loopback it serves plaintext, and then anyone on
// the machine drives it, fault injection included: that is what --insecure means.
func TestInsecureRefusesTheNetwork(t *testing.T) {
	cfg := simConfig(t)
	port := freeLoopback(t)
	_, p, _ := net.SplitHostPort(port)
	cfg.Insecure, cfg.Listen = true, ":"+p
	if _, err := newNode(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "--insecure-unauthenticated-remote") {
		t.Fatalf("--insecure on every address: %v", err)
	}
	if c, err := net.Dial("tcp", port); err == nil {
		c.Close()
		t.Fatal("the refused --insecure listener accepts")
	}

	cfg.Listen = port
	ctx, cancel := context.WithCancel(context.Background())
	n, err := newNode(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() { cancel(); n.services.Wait() }()
	conn, err := grpc.NewClient("passthrough:///"+port, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if _, err := agentv1.NewAgentServiceClient(conn).InjectFault(cctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu0"}}); err != nil {
		t.Fatalf("--insecure on loopback: %v", err)
	}
}

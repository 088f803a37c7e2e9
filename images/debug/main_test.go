package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

// build compiles gpurack-debug as hack/debug-image.sh does (static) into a temporary
// directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpurack-debug")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestRunsInTheHostRoot runs the real binary with this machine's own / as the "node's
// root" (the chroot is then a no-op, but it is made): a command runs there with the
// node's PATH, its exit status comes back, and the session is announced on stderr as
// recorded only by the audit log when no journal socket exists.
func TestRunsInTheHostRoot(t *testing.T) {
	testreq.Root(t, "gpurack-debug calls chroot(2)")
	bin := build(t)
	cmd := exec.Command(bin, "--host", "/", "sh", "-c", `echo "path=$PATH"; exit 3`)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("want exit status 3, got %v (stdout %q)", err, out)
	}
	if !strings.Contains(string(out), "path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("the command did not get the node's PATH: %q", out)
	}
	if errors.As(err, &ee) && !journalSocketExists() && !strings.Contains(string(ee.Stderr), "recorded only in the apiserver's audit log") {
		t.Errorf("no journal socket here, and stderr does not say the session is unrecorded on the node: %q", ee.Stderr)
	}
}

// TestRefusesWithoutAHostRoot: started as an ordinary pod (no /host), it says how to
// start it, and a command missing on the node is named.
func TestRefusesWithoutAHostRoot(t *testing.T) {
	bin := build(t)
	out, err := exec.Command(bin, "--host", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "kubectl debug node/NAME --profile=sysadmin --image=gpurack.io/debug:v1") {
		t.Errorf("an empty host root: err %v, output %q; want the kubectl debug command to use", err, out)
	}
	testreq.Root(t, "gpurack-debug calls chroot(2)")
	out, err = exec.Command(bin, "--host", "/", "no-such-tool-on-the-node").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no-such-tool-on-the-node: not found on the node") {
		t.Errorf("a missing command: err %v, output %q", err, out)
	}
}

// TestInteractiveEnv: the interactive shell gets the prompt marker and the command
// logging; a one-off command gets neither, and only TERM and LANG pass from the pod.
func TestInteractiveEnv(t *testing.T) {
	in := []string{"TERM=xterm", "LANG=C.UTF-8", "SECRET=x", "PATH=/x"}
	shell := strings.Join(sessionEnv(in, true), "\n")
	for _, want := range []string{"debian_chroot=break-glass", "PROMPT_COMMAND=history 1", "logger -t gpurack-break-glass", "TERM=xterm", "LANG=C.UTF-8"} {
		if !strings.Contains(shell, want) {
			t.Errorf("interactive env lacks %q:\n%s", want, shell)
		}
	}
	once := strings.Join(sessionEnv(in, false), "\n")
	if strings.Contains(once, "PROMPT_COMMAND") || strings.Contains(once, "SECRET") || strings.Contains(once, "PATH=/x") {
		t.Errorf("a one-off command's env:\n%s", once)
	}
}

func journalSocketExists() bool {
	_, err := os.Stat("/run/systemd/journal/socket")
	return err == nil
}

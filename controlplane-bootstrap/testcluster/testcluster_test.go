package testcluster

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// New gives a working control plane with admin and enroller credentials and
// a join token, and its cleanup leaves no process, port or directory behind.
func TestNewStartsAndCleansUp(t *testing.T) {
	Require(t)
	var c *Cluster
	t.Run("use", func(t *testing.T) {
		c = New(t)
		token := c.JoinToken(t)
		if len(token) != 23 || token[6] != '.' {
			t.Errorf("token %q", token)
		}
		if _, err := c.Clientset(t).CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{c.AdminKubeconfig, c.EnrollerKubeconfig} {
			if _, err := os.Stat(p); err != nil {
				t.Error(err)
			}
		}
		if !strings.HasPrefix(c.CAPin, "sha256:") {
			t.Errorf("CA pin %q", c.CAPin)
		}
	})
	if c == nil {
		t.Fatal("no cluster")
	}
	if _, err := os.Stat(c.Dir); err == nil {
		t.Errorf("%s still exists after cleanup", c.Dir)
	}
	if err := components.CheckPorts(components.Specs(c.Config, components.Layout{Dir: c.Dir})); err != nil {
		t.Errorf("a port is still taken after cleanup: %v", err)
	}
	for _, name := range components.Names {
		if pid := c.cp.Supervisor.PID(name); pid > 0 {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("%s (pid %d) still running after cleanup", name, pid)
			}
		}
	}
}

func TestSharedNeedsMain(t *testing.T) {
	// Without TestMain calling Main, Shared must refuse rather than leak a
	// control plane; this package's tests run without Main.
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { recover() }()
		Shared(ft)
	}()
	if !strings.Contains(ft.msg, "testcluster.Main") && !strings.Contains(ft.msg, "skipping") {
		t.Errorf("Shared without Main: %q", ft.msg)
	}
}

type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatal(args ...any) {
	for _, a := range args {
		if s, ok := a.(string); ok {
			f.msg += s
		}
	}
	panic("fatal")
}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg += format; panic("fatal") }
func (f *fatalRecorder) Skipf(format string, args ...any)  { f.msg += "skipping"; panic("skip") }
func (f *fatalRecorder) Helper()                           {}

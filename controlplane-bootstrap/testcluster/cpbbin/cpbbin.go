// Package cpbbin builds the controlplane-bootstrap command for tests that run it as
// separate processes, as on real hosts (in network namespaces): once per test binary.
package cpbbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Path builds controlplane-bootstrap from this module on first use and returns the
// binary's path. Remove deletes it; call it from TestMain after m.Run.
func Path(t testing.TB) string {
	t.Helper()
	goTool := testreq.Tool(t, "go", "install Go (the test builds controlplane-bootstrap)")
	once.Do(func() {
		mod, merr := exec.Command(goTool, "env", "GOMOD").Output()
		if merr != nil || strings.TrimSpace(string(mod)) == "" {
			err = fmt.Errorf("go env GOMOD: %v (%q)", merr, mod)
			return
		}
		if dir, err = os.MkdirTemp("", "cpb-test-*"); err != nil {
			return
		}
		cmd := exec.Command(goTool, "build", "-o", filepath.Join(dir, "controlplane-bootstrap"), "./controlplane-bootstrap/cmd/controlplane-bootstrap")
		cmd.Dir = filepath.Dir(strings.TrimSpace(string(mod)))
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build controlplane-bootstrap: %v\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "controlplane-bootstrap")
}

// Remove deletes what Path built.
func Remove() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

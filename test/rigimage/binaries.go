package rigimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// Binaries are gpuimage, gpuboot and controlplane-bootstrap built from this tree: what
// a rig runs on the host side.
type Binaries struct{ Gpuimage, Gpuboot, ControlPlane string }

// built is the Binaries, built once per test binary (removed by RemoveBinaries).
var built struct {
	once sync.Once
	dir  string
	err  error
}

// RepoRoot is the repository's root directory: the nearest directory above the test's
// working directory that holds go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the test's directory: rigimage is for tests inside the repository")
		}
		dir = parent
	}
}

// BuildBinaries builds gpuimage, gpuboot and controlplane-bootstrap from this tree as
// `make build` does (cgo on, -trimpath), once per test binary; TestMain removes them
// with RemoveBinaries.
func BuildBinaries(t testing.TB) Binaries {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "gpurack-rig-bins-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/",
			"./imagebuilder/cmd/gpuimage", "./pxe/cmd/gpuboot", "./controlplane-bootstrap/cmd/controlplane-bootstrap")
		cmd.Dir = RepoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return Binaries{filepath.Join(built.dir, "gpuimage"), filepath.Join(built.dir, "gpuboot"), filepath.Join(built.dir, "controlplane-bootstrap")}
}

// RemoveBinaries removes what BuildBinaries built; TestMain calls it after the tests.
func RemoveBinaries() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// RequireImageBuild checks that this machine can build the rig images, unless
// ReuseEnv stands in for them; under `make test` (testreq.Required) ReuseEnv is
// refused, since it would leave the images built from this tree out quietly.
func RequireImageBuild(t testing.TB) {
	t.Helper()
	reuse := os.Getenv(ReuseEnv)
	if reuse != "" && testreq.Required() {
		t.Fatalf("%s=%s is set under %s=1: it would stand in for the images built from this tree; unset it (it is for a developer's local runs only)", ReuseEnv, reuse, testreq.RequiredEnv)
	}
	if reuse == "" {
		buildtest.RequireImageTools(t, "go")
	}
}

//go:build linux

package systemdhost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/test/rigimage"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binaries are gpuimage, gpuboot and controlplane-bootstrap built from this tree.
type binaries struct{ gpuimage, gpuboot, controlplane string }

// built is the binaries, built once per test binary (removed by TestMain).
var built struct {
	once sync.Once
	dir  string
	err  error
}

// requireHost checks what every test here needs: root, network namespaces, and
// systemd-nspawn, nsenter, unshare and curl.
func requireHost(t *testing.T) {
	t.Helper()
	testreq.Root(t, "booting the node image under systemd-nspawn")
	netnstest.Require(t)
	testreq.Tool(t, "systemd-nspawn", "apt-get install systemd-container (hack/deps.sh lists it); it boots the node image with systemd as PID 1")
	testreq.Tool(t, "nsenter", "apt-get install util-linux; it runs commands in the container")
	testreq.Tool(t, "unshare", "apt-get install util-linux; it keeps the container's mounts private")
	testreq.Tool(t, "curl", "apt-get install curl (hack/deps.sh lists it); it is the network's client")
}

// repoRoot is the repository's root directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildBinaries builds gpuimage, gpuboot and controlplane-bootstrap from this tree as
// `make build` does (cgo on, -trimpath), once per test binary.
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "gpurack-systemdhost-bins-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		cmd := exec.Command("go", "build", "-trimpath", "-o", dir+"/",
			"./imagebuilder/cmd/gpuimage", "./pxe/cmd/gpuboot", "./controlplane-bootstrap/cmd/controlplane-bootstrap")
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return binaries{filepath.Join(built.dir, "gpuimage"), filepath.Join(built.dir, "gpuboot"), filepath.Join(built.dir, "controlplane-bootstrap")}
}

// nodeImage is the tiny node image's directory (rootfs.squashfs, the signed manifest,
// kernel and initrd), from the image cache test/qemu uses: the same cache entry, built
// on a miss. Its store's signing key is returned too.
func nodeImage(t *testing.T, bins binaries) (dir, pubKey string) {
	t.Helper()
	if reuse := os.Getenv(rigimage.ReuseEnv); reuse != "" && testreq.Required() {
		t.Fatalf("%s=%s is set under %s=1: it would stand in for the image built from this tree; unset it (it is for a developer's local runs only)", rigimage.ReuseEnv, reuse, testreq.RequiredEnv)
	}
	if os.Getenv(rigimage.ReuseEnv) == "" {
		buildtest.RequireImageTools(t, "go")
	}
	store := rigimage.NewStore(t, repoRoot(t), bins.gpuimage, rigimage.Tiny)
	return filepath.Join(store.Dir, store.IDs[rigimage.Tiny]), store.PubKeys[0]
}

// stageTree makes a directory holding files (path in the tree → host file), hard
// linked or copied, for a container to bind read-only: the repository's files and
// binaries a documented procedure names by relative path.
func stageTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for rel, src := range files {
		if err := buildtest.LinkTree(src, filepath.Join(dir, rel)); err != nil {
			t.Fatalf("stage %s: %v", rel, err)
		}
	}
	return dir
}

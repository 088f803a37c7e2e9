//go:build linux

package systemdhost

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/test/rigimage"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	rigimage.RemoveBinaries()
	os.Exit(code)
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
func repoRoot(t *testing.T) string { return rigimage.RepoRoot(t) }

// nodeImage is the tiny node image's directory (rootfs.squashfs, the signed manifest,
// kernel and initrd), from the image cache test/qemu uses: the same cache entry, built
// on a miss. Its store's signing key is returned too.
func nodeImage(t *testing.T, bins rigimage.Binaries) (dir, pubKey string) {
	t.Helper()
	rigimage.RequireImageBuild(t)
	store := rigimage.NewStore(t, repoRoot(t), bins.Gpuimage, rigimage.Tiny)
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

// Package buildtest holds what tests that build gpurack images share: the check that
// this machine can build one, which skips the test, saying why, when it cannot.
package buildtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/profile"
)

// RequireImageTools skips t unless this machine can build images with gpuimage: root,
// the Debian tools (plus extraTools, such as qemu-system-x86_64 for a boot), the
// pinned kubelet and pause image from `make k8s-bins`, and a Debian source. It returns
// the directory of the pinned Kubernetes binaries. `make test` installs all of it
// first (make deps), so CI does not skip.
func RequireImageTools(t testing.TB, extraTools ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: gpuimage build needs root (mmdebstrap --mode=root)")
	}
	for _, tool := range append([]string{"mmdebstrap", "mksquashfs", "unsquashfs", "apt-get", "dpkg-deb", "depmod"}, extraTools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed (run make deps)", tool)
		}
	}
	k8s := os.Getenv("GPURACK_K8S_DIR")
	if k8s == "" {
		d, _ := os.UserCacheDir()
		k8s = filepath.Join(d, "gpurack", "k8s", "v1.34.2")
	}
	for _, f := range []string{"bin/kubelet", "images/pause.tar"} {
		if _, err := os.Stat(filepath.Join(k8s, f)); err != nil {
			t.Skipf("skipping: %s is missing (run make k8s-bins)", filepath.Join(k8s, f))
		}
	}
	if _, err := build.Sources(&profile.Profile{Base: profile.Base{Suite: "bookworm"}}); err != nil {
		t.Skipf("skipping: %v", err)
	}
	return k8s
}

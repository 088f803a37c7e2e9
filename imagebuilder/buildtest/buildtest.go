// Package buildtest holds what tests that build gpurack images share: the check that
// this machine can build one, which skips the test, saying why, when it cannot.
package buildtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/testreq"
)

// RequireImageTools skips t unless this machine can build images with gpuimage: root,
// the Debian tools (plus extraTools, such as qemu-system-x86_64 for a boot), the
// pinned kubelet and pause image from `make k8s-bins`, and a Debian source. It returns
// the directory of the pinned Kubernetes binaries. `make test` installs all of it
// first (make deps), so CI does not skip.
func RequireImageTools(t testing.TB, extraTools ...string) string {
	t.Helper()
	testreq.Root(t, "gpuimage build (mmdebstrap --mode=root)")
	for _, tool := range append([]string{"mmdebstrap", "mksquashfs", "unsquashfs", "apt-get", "dpkg-deb", "depmod"}, extraTools...) {
		testreq.Tool(t, tool, "run make deps")
	}
	k8s := os.Getenv("GPURACK_K8S_DIR")
	if k8s == "" {
		d, _ := os.UserCacheDir()
		k8s = filepath.Join(d, "gpurack", "k8s", "v1.34.2")
	}
	for _, f := range []string{"bin/kubelet", "images/pause.tar"} {
		testreq.File(t, filepath.Join(k8s, f), "run make k8s-bins")
	}
	if _, err := build.Sources(&profile.Profile{Base: profile.Base{Suite: "bookworm"}}); err != nil {
		testreq.Missing(t, fmt.Sprintf("no Debian source to build from (%v)", err), "configure a Debian apt source on this machine")
	}
	return k8s
}

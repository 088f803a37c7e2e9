// Package buildtest holds what tests that build gpurack images share: the check that
// this machine can build one, which skips the test (or, where the test was asked for
// explicitly, fails it), saying why, when it cannot.
package buildtest

import (
	"fmt"
	"os"
	"os/exec"
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
	k8s, missing := imageTools(extraTools)
	if missing != "" {
		testreq.Missing(t, missing, "run make deps and make k8s-bins")
	}
	return k8s
}

// NeedImageTools is RequireImageTools for a test that was asked for explicitly (make
// e2e-slow): it fails t, saying what is missing, instead of skipping, so that the run
// cannot pass without building anything.
func NeedImageTools(t testing.TB, extraTools ...string) string {
	t.Helper()
	k8s, missing := imageTools(extraTools)
	if missing != "" {
		t.Fatal("this machine cannot build images: " + missing)
	}
	return k8s
}

// imageTools returns the pinned Kubernetes directory and, when this machine cannot
// build images, why not.
func imageTools(extraTools []string) (k8s, missing string) {
	if os.Geteuid() != 0 {
		return "", "gpuimage build needs root (mmdebstrap --mode=root)"
	}
	for _, tool := range append([]string{"mmdebstrap", "mksquashfs", "unsquashfs", "apt-get", "dpkg-deb", "depmod"}, extraTools...) {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Sprintf("%s is not installed (run make deps)", tool)
		}
	}
	k8s = os.Getenv("GPURACK_K8S_DIR")
	if k8s == "" {
		d, _ := os.UserCacheDir()
		k8s = filepath.Join(d, "gpurack", "k8s", "v1.34.2")
	}
	for _, f := range []string{"bin/kubelet", "bin/kube-proxy", "bin/node_exporter", "images/pause.tar"} {
		if _, err := os.Stat(filepath.Join(k8s, f)); err != nil {
			return "", fmt.Sprintf("%s is missing (run make k8s-bins)", filepath.Join(k8s, f))
		}
	}
	if _, err := build.Sources(&profile.Profile{Base: profile.Base{Suite: "bookworm"}}); err != nil {
		return "", err.Error()
	}
	return k8s, ""
}

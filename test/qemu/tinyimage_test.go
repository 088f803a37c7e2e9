//go:build linux

package qemu

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// store holds the images the tests of this package share, signed with one key: each
// is built once per test binary, by the first test that asks, into a directory that
// outlives that test (removed by TestMain).
var store struct {
	once         sync.Once
	dir          string
	priv, pubKey string
	ok           bool
	tiny, simGPU sharedImage
}

// sharedImage is one image of the store.
type sharedImage struct {
	once     sync.Once
	imageDir string // empty: its build failed
}

// simGPUSection makes the tiny profile a simulated GPU image (gpu.simulator): the GPU
// container runtime of its containerd, and the agent's simulator of a DGX H100 (8
// simulated GPUs, labelled so everywhere) served to kubelet by the device plugin; no
// driver.
const simGPUSection = `gpu:
  vendor: nvidia
  simulator: dgxh100
  expect: {count: 8, product: NVIDIA H100 80GB HBM3, memoryMiB: 81559, pcie: {gen: 5, width: 16}, nvlinkLinks: 18}
`

// sharedTinyImage is the tiny image, built at most once per package run:
// TestTinyNodeJoin, TestPowerOnToNode and the others boot the same image, so CI builds
// it once.
func sharedTinyImage(t *testing.T, root, gpuimage, k8sDir string) (imageDir, pubKey string) {
	t.Helper()
	return storeImage(t, &store.tiny, root, gpuimage, k8sDir, "tiny", ""), store.pubKey
}

// storeImage builds img (buildTinyImage with name and section) once and links it out
// of the building test's temporary directory, which goes when that test ends, into the
// store.
func storeImage(t *testing.T, img *sharedImage, root, gpuimage, k8sDir, name, section string) string {
	t.Helper()
	store.once.Do(func() {
		dir, err := os.MkdirTemp("", "gpurack-images-")
		if err != nil {
			t.Fatal(err)
		}
		store.dir = dir
		store.priv, store.pubKey = filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
		runGpuimage(t, root, gpuimage, "keygen", store.priv, store.pubKey)
		store.ok = true
	})
	if !store.ok {
		t.Fatal("the shared image store was not made: an earlier test of this package failed to make it (its log says why)")
	}
	img.once.Do(func() {
		built := buildTinyImage(t, root, gpuimage, k8sDir, name, section, store.priv) // a t.Fatal here leaves imageDir empty
		dst := filepath.Join(store.dir, "store", filepath.Base(built))
		if err := linkTree(built, dst); err != nil {
			t.Fatalf("keep the %s image for the other tests: %v", name, err)
		}
		img.imageDir = dst
	})
	if img.imageDir == "" {
		t.Fatalf("the %s image was not built: an earlier test of this package failed to build it (its log says why)", name)
	}
	return img.imageDir
}

// linkTree recreates src (a file or a directory tree) at dst with hard links, copying
// where a link is not possible.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return errors.New(p + " is not a regular file or directory")
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if os.Link(p, target) == nil {
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestMain removes the shared images after the package's tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if store.dir != "" {
		os.RemoveAll(store.dir)
	}
	os.Exit(code)
}

// joinImage is what both QEMU join tests start from: the tools they need, the binaries
// built from this tree, and the tiny image (built once per package run, or the one
// GPURACK_JOIN_IMAGE names, with GPURACK_JOIN_IMAGE_PUBKEY or gpuimage's default key).
func joinImage(t *testing.T) (bins joinBinaries, imageDir, pubKey string) {
	t.Helper()
	reuse := os.Getenv("GPURACK_JOIN_IMAGE")
	if reuse != "" && testreq.Required() {
		// A developer's shortcut: it skips the image build and the tool checks, and the
		// simulated GPU node's checks do not run. Under make test (CI) nothing may be left
		// out quietly.
		t.Fatalf("GPURACK_JOIN_IMAGE=%s is set under %s=1: it would skip the image build and the simulated GPU checks; unset it (it is for a developer's local runs only)", reuse, testreq.RequiredEnv)
	}
	var k8sDir string
	if reuse == "" {
		k8sDir = buildtest.RequireImageTools(t, "go")
	}
	testcluster.Require(t)
	netnstest.Require(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bins = buildJoinBinaries(t, root)
	if reuse != "" {
		imageDir, pubKey = reuse, os.Getenv("GPURACK_JOIN_IMAGE_PUBKEY")
		if pubKey == "" {
			pubKey = filepath.Join(build.DefaultCacheDir(), "signing-key.pub.pem")
		}
		t.Logf("reusing image %s from GPURACK_JOIN_IMAGE (key %s): its gpuagent is the one built into it, not this tree's", imageDir, pubKey)
		return bins, imageDir, pubKey
	}
	imageDir, pubKey = sharedTinyImage(t, root, bins.gpuimage, k8sDir)
	return bins, imageDir, pubKey
}

// simGPUImage is the simulated GPU variant of the tiny image (simGPUSection), built
// from this tree at most once per package run, in the tiny image's store and signed
// with the same key.
func simGPUImage(t *testing.T, bins joinBinaries) string {
	t.Helper()
	k8sDir := buildtest.RequireImageTools(t, "go")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return storeImage(t, &store.simGPU, root, bins.gpuimage, k8sDir, "tiny-simgpu", simGPUSection)
}

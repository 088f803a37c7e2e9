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
)

// tiny is the tiny image that the tests of this package share: it is built once per
// test binary, by the first test that asks, into a directory that outlives that test.
var tiny struct {
	once             sync.Once
	dir              string // removed by TestMain
	imageDir, pubKey string
	built            bool
}

// sharedTinyImage is buildTinyImage at most once per package run: TestTinyNodeJoin and
// TestPowerOnToNode boot the same image, so CI builds tiny once. The image is linked
// (or copied) out of the building test's temporary directory, which goes when that test
// ends.
func sharedTinyImage(t *testing.T, root, gpuimage, k8sDir string) (imageDir, pubKey string) {
	t.Helper()
	tiny.once.Do(func() {
		img, pub := buildTinyImage(t, root, gpuimage, k8sDir) // a t.Fatal here leaves built false
		dir, err := os.MkdirTemp("", "gpurack-tiny-")
		if err != nil {
			t.Fatal(err)
		}
		tiny.dir = dir
		imageDir = filepath.Join(dir, "store", filepath.Base(img))
		pubKey = filepath.Join(dir, "key.pub.pem")
		if err := linkTree(img, imageDir); err != nil {
			t.Fatalf("keep the tiny image for the other tests: %v", err)
		}
		if err := linkTree(pub, pubKey); err != nil {
			t.Fatalf("keep the tiny image's key for the other tests: %v", err)
		}
		tiny.imageDir, tiny.pubKey, tiny.built = imageDir, pubKey, true
	})
	if !tiny.built {
		t.Fatal("the tiny image was not built: an earlier test of this package failed to build it (its log says why)")
	}
	return tiny.imageDir, tiny.pubKey
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

// TestMain removes the shared tiny image after the package's tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if tiny.dir != "" {
		os.RemoveAll(tiny.dir)
	}
	os.Exit(code)
}

// joinImage is what both QEMU join tests start from: the tools they need, the binaries
// built from this tree, and the tiny image (built once per package run, or the one
// GPURACK_JOIN_IMAGE names, with GPURACK_JOIN_IMAGE_PUBKEY or gpuimage's default key).
func joinImage(t *testing.T) (bins joinBinaries, imageDir, pubKey string) {
	t.Helper()
	reuse := os.Getenv("GPURACK_JOIN_IMAGE")
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

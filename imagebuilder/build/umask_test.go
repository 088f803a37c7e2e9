package build

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestStagesIgnoreTheUmask runs the stages that write files (customize, squashfs,
// initramfs, sbom, manifest, publish) over a small kernel and node under umask 022 and
// under 077, and compares what they leave: the tree mmdebstrap would get from the
// overlay and the published image directory, every path's mode and bytes. Build pins
// the umask as well; this guards the stages' own modes without the long build.
func TestStagesIgnoreTheUmask(t *testing.T) {
	testreq.Tool(t, "cp", "install coreutils")
	a := writeStages(t, 0o022)
	b := writeStages(t, 0o077)
	for _, part := range []string{"tree", "image"} {
		if len(a[part]) == 0 {
			t.Fatalf("the stages wrote no %s", part)
		}
		for path, want := range a[part] {
			if got, ok := b[part][path]; !ok {
				t.Errorf("%s %s: written under umask 022, missing under 077", part, path)
			} else if got != want {
				t.Errorf("%s %s: %s under umask 022, %s under 077", part, path, want, got)
			}
		}
		for path := range b[part] {
			if _, ok := a[part][path]; !ok {
				t.Errorf("%s %s: written under umask 077 only", part, path)
			}
		}
	}
	// Equal could still be equally wrong.
	for part, want := range map[string]map[string]string{
		"tree":  {".": "drwxr-xr-x", "etc": "drwxr-xr-x", "etc/gpurack": "drwxr-xr-x", "usr/lib/gpurack": "drwxr-xr-x", "usr/bin/gpuagent": "-rwxr-xr-x", "etc/systemd/system/gpuagent.service": "-rw-r--r--"},
		"image": {".": "drwxr-xr-x", manifest.ArtifactInitrd: "-rw-r--r--", manifest.ArtifactKernel: "-rw-r--r--", manifest.ArtifactRootfs: "-rw-r--r--", manifest.ArtifactCmdline: "-rw-r--r--", manifest.ArtifactSBOM: "-rw-r--r--", manifest.ManifestFile: "-rw-r--r--", manifest.SignatureFile: "-rw-r--r--"},
	} {
		for path, mode := range want {
			if got := strings.Fields(b[part][path]); len(got) == 0 || got[0] != mode {
				t.Errorf("%s %s under umask 077: %q, want mode %s", part, path, b[part][path], mode)
			}
		}
	}
}

// writeStages runs the file-writing stages under umask in a new directory and returns,
// for the overlay copied into a tree (as mmdebstrap's hook does) and for the published
// image, each relative path's mode and content digest.
func writeStages(t *testing.T, umask int) map[string]map[string]string {
	old := unix.Umask(umask)
	defer unix.Umask(old)
	dir := t.TempDir()
	p, err := profile.Load("../../profiles/tiny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lockBytes, err := os.ReadFile("../../profiles/tiny.lock.json")
	if err != nil {
		t.Fatal(err)
	}
	lock, err := profile.ParseLock("tiny.lock.json", lockBytes)
	if err != nil {
		t.Fatal(err)
	}
	// The inputs are written under the umask too, as a builder's own files would be.
	const kver = "6.1.0-57-amd64"
	src := filepath.Join(dir, "src")
	modDir := filepath.Join(src, "kernel", "lib", "modules", kver)
	inputs := map[string]string{
		"k8s/bin/kubelet": "kubelet", "k8s/bin/kube-proxy": "kube-proxy", "k8s/bin/node_exporter": "node_exporter", "k8s/images/pause.tar": "pause", "gpuagent": "gpuagent", "gpuagent.service": "[Unit]\n", "gpurack-init": "init",
		"kernel/boot/vmlinuz-" + kver:                                    "vmlinuz",
		"kernel/lib/modules/" + kver + "/kernel/fs/overlayfs/overlay.ko": "overlay.ko",
		"kernel/lib/modules/" + kver + "/kernel/drivers/block/loop.ko":   "loop.ko",
		"kernel/lib/modules/" + kver + "/modules.builtin":                "kernel/fs/ext4/ext4.ko\n",
	}
	for name, content := range inputs {
		path := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	work, err := os.MkdirTemp(dir, "work-")
	if err != nil {
		t.Fatal(err)
	}
	b := &imageBuild{
		o: Options{Out: filepath.Join(dir, "out"), AgentUnit: filepath.Join(src, "gpuagent.service"),
			AgentBin: filepath.Join(src, "gpuagent"), InitBin: filepath.Join(src, "gpurack-init"), K8sDir: filepath.Join(src, "k8s")},
		rep: NewReporter(io.Discard), work: work, p: p, lock: lock, lockBytes: lockBytes, epoch: 1700000000,
		key:     ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize)),
		imageID: strings.Repeat("0", 40), kernelPkg: profile.LockedPackage{Name: "linux-image-" + kver},
		vmlinuz: filepath.Join(src, "kernel/boot/vmlinuz-"+kver), kver: kver, modDir: modDir,
		nodeMods: []string{"kernel/fs/overlayfs/overlay.ko", "kernel/drivers/block/loop.ko"},
		initMods: []string{"kernel/drivers/block/loop.ko"},
	}
	ctx := context.Background()
	if err := b.hostInputs(); err != nil {
		t.Fatal(err)
	}
	if err := b.binaries(ctx); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(work, "overlay")
	if _, err := b.customize(overlay, filepath.Join(work, "installed.txt")); err != nil {
		t.Fatal(err)
	}
	// mmdebstrap (umask 022 itself) makes the tree; its hook copies the overlay over it.
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tree, 0o755)
	if out, err := exec.Command("cp", "-a", overlay+"/.", tree+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	if _, err := exec.LookPath("mksquashfs"); err != nil && testreq.Required() {
		testreq.Missing(t, "mksquashfs is not in PATH", "apt-get install squashfs-tools (hack/deps.sh installs it)")
	}
	if _, err := exec.LookPath("mksquashfs"); err == nil {
		// A tarball of the tree as mmdebstrap writes one: sorted, owned by root,
		// times clamped.
		b.tarball = filepath.Join(work, "rootfs.tar")
		cmd := exec.Command("tar", "-C", tree, "--sort=name", "--numeric-owner", "--owner=0", "--group=0",
			fmt.Sprintf("--mtime=@%d", b.epoch), "--clamp-mtime", "-cf", b.tarball, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("tar: %v\n%s", err, out)
		}
		if err := b.squashfs(ctx); err != nil {
			t.Fatal(err)
		}
		// mksquashfs -tar ignores the tarball's "./" entry; the root must still be 0755.
		if list, err := exec.Command("unsquashfs", "-lln", filepath.Join(b.stageDir, manifest.ArtifactRootfs)).Output(); err == nil {
			if first, _, _ := strings.Cut(string(list), "\n"); !strings.HasPrefix(first, "drwxr-xr-x ") {
				t.Errorf("the squashfs root directory: %q, want drwxr-xr-x", first)
			}
		}
	} else {
		// Only outside make test (testreq.Required is false): the other stages still
		// run, and the stand-in is named.
		t.Log("STAND-IN: mksquashfs is not installed: a stand-in rootfs.squashfs replaces the squashfs stage (make test fails instead)")
		if err := b.makeStageDir(); err != nil {
			t.Fatal(err)
		}
		if err := writeFileMode(filepath.Join(b.stageDir, manifest.ArtifactRootfs), []byte("squashfs"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, stage := range []func(context.Context) error{b.initramfs, b.sbom, b.sign, b.publish} {
		if err := stage(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]map[string]string{"tree": modesAndDigests(t, tree), "image": modesAndDigests(t, b.final)}
}

// modesAndDigests maps each path under root (root itself as ".") to its mode and the
// sha256 of its content, or its link target.
func modesAndDigests(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		var content string
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			content = hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			content, _ = os.Readlink(path)
		}
		out[rel] = info.Mode().String() + " " + content
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBuildPinsTheUmask: what Build's child processes create does not depend on the
// umask Build was started under, and Build leaves the caller's umask as it was.
func TestBuildPinsTheUmask(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	restore := pinUmask()
	out, err := exec.Command("sh", "-c", "umask").Output()
	restore()
	if err != nil {
		t.Fatalf("sh -c umask: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "0022" {
		t.Errorf("a child of the pinned build sees umask %s, want 0022", got)
	}
	if got := unix.Umask(0o077); got != 0o077 {
		t.Errorf("after the build the umask is %04o, want the caller's 0077", got)
	}
}

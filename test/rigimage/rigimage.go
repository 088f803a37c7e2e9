// Package rigimage builds the node images the test rigs boot, through the
// content-addressed image cache (imagebuilder/buildtest.ImageCache): the tiny image
// (profiles/tiny.yaml with the probe, CoreDNS and debug images preloaded and every
// virtio disk a data disk), its simulated GPU variant, and that variant under another
// name. test/qemu boots them in QEMU guests; test/systemdhost boots the tiny image's
// root filesystem under systemd-nspawn. Both take them from here, so one cache entry
// serves both packages (a second recipe for the same image would cost a build and
// evict an entry).
//
// It is for tests only: every function takes the test's testing.TB and fails it on an
// error. It does not boot anything.
package rigimage

import (
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/profile"
)

// The images a rig machine boots: the tiny image, and its simulated GPU variant
// (SimGPUSection).
const (
	Tiny   = "tiny"
	SimGPU = "tiny-simgpu"
	// SimGPUNext is the same profile under another name, so another image id: the
	// image a rollout moves a simulated GPU machine to.
	SimGPUNext = "tiny-simgpu-next"
)

// The container images every rig image preloads (profile images:).
const (
	// ProbeImage is the tag hack/probe-image.sh gives the probe archive.
	ProbeImage = "gpurack.io/probe:v1"
	// DebugImage is the break-glass debug image (images/debug, hack/debug-image.sh),
	// for kubectl debug node.
	DebugImage = "gpurack.io/debug:v1"
)

// SimGPUSection makes the tiny profile a simulated GPU image (gpu.simulator): the GPU
// container runtime of its containerd, and the agent's simulator of a DGX H100 (8
// simulated GPUs, labelled so everywhere) served to kubelet by the device plugin; no
// driver.
const SimGPUSection = `gpu:
  vendor: nvidia
  simulator: dgxh100
  expect: {count: 8, product: NVIDIA H100 80GB HBM3, memoryMiB: 81559, pcie: {gen: 5, width: 16}, nvlinkLinks: 18}
`

// ReuseEnv names a developer's shortcut: an image directory that stands in for every
// image name, instead of a build. ReusePubKeyEnv names its signing key (default: the
// key gpuimage keeps in its cache directory). `make test` refuses it (test/qemu's
// rigBinaries).
const (
	ReuseEnv       = "GPURACK_JOIN_IMAGE"
	ReusePubKeyEnv = "GPURACK_JOIN_IMAGE_PUBKEY"
)

// Store is an image store for gpuboot (images.store) holding the images named.
type Store struct {
	Dir     string            // images.store: a directory of image directories
	PubKeys []string          // the keys they are signed with (images.trustedKeys)
	IDs     map[string]string // image name (Tiny, SimGPU, …) -> image ID
}

// entries is what this test binary has taken from the image cache, by name: each
// image's cache entry is looked up (and built, on a miss) once per binary.
var entries struct {
	mu  sync.Mutex
	dir map[string]string
}

// NewStore links the images named into a new store directory for gpuboot. Each comes
// from the content-addressed image cache (buildtest.ImageCache), keyed on the profile,
// its lock, the preloaded archives, the pinned Kubernetes binaries and the Go sources
// of gpuimage, gpuagent and gpurack-init: built once per change of those, not once per
// test or CI run. root is the repository's root, gpuimage a gpuimage built from it.
// ReuseEnv stands in for every name.
func NewStore(t testing.TB, root, gpuimage string, names ...string) Store {
	t.Helper()
	store := Store{Dir: t.TempDir(), IDs: map[string]string{}}
	for _, name := range names {
		if reuse := os.Getenv(ReuseEnv); reuse != "" {
			pub := cmp.Or(os.Getenv(ReusePubKeyEnv), filepath.Join(build.DefaultCacheDir(), "signing-key.pub.pem"))
			t.Logf("reusing image %s from %s (key %s) as %s: its gpuagent is the one built into it, not this tree's", reuse, ReuseEnv, pub, name)
			if len(store.PubKeys) == 0 { // one image stands in for every name
				if err := buildtest.LinkTree(reuse, filepath.Join(store.Dir, filepath.Base(reuse))); err != nil {
					t.Fatal(err)
				}
				store.PubKeys = append(store.PubKeys, pub)
			}
			store.IDs[name] = filepath.Base(reuse)
			continue
		}
		entry := Cached(t, root, gpuimage, name)
		id := entryImageID(t, entry)
		if err := buildtest.LinkTree(filepath.Join(entry, "store", id), filepath.Join(store.Dir, id)); err != nil {
			t.Fatalf("link image %s into gpuboot's store: %v", id, err)
		}
		store.PubKeys = append(store.PubKeys, filepath.Join(entry, "key.pub.pem"))
		store.IDs[name] = id
	}
	return store
}

// entryImageID is the ID of the one image in cache entry entry (Cached): the image is
// entry/store/ID.
func entryImageID(t testing.TB, entry string) string {
	t.Helper()
	dirs, err := os.ReadDir(filepath.Join(entry, "store"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("image cache entry %s holds no single image (%v)", entry, err)
	}
	return dirs[0].Name()
}

// Cached is the image cache entry of image name (Tiny, SimGPU or SimGPUNext): a
// signing key pair (key.pem, key.pub.pem) and store/ID/, the image. It builds the
// image on a miss (minutes), and skips t (testreq) when this machine cannot.
func Cached(t testing.TB, root, gpuimage, name string) string {
	t.Helper()
	entries.mu.Lock()
	defer entries.mu.Unlock()
	if e, ok := entries.dir[name]; ok {
		return e
	}
	section := ""
	if name == SimGPU || name == SimGPUNext {
		section = SimGPUSection
	}
	k8sDir := buildtest.RequireImageTools(t, "go")
	prof := Profile(t, root, gpuimage, name, section)
	key := buildtest.NewKey("test/qemu tiny image v1")
	agentUnit := filepath.Join(root, "agent", "systemd", "gpuagent.service")
	for _, err := range []error{
		key.File("profile", prof), key.File("lock", profile.LockPath(prof)),
		key.File("probe.tar", filepath.Join(filepath.Dir(prof), "probe.tar")),
		key.File("coredns.tar", filepath.Join(filepath.Dir(prof), "coredns.tar")),
		key.File("debug.tar", filepath.Join(filepath.Dir(prof), "debug.tar")),
		key.File("agent unit", agentUnit), key.Dir("k8s", k8sDir),
		key.GoSources(root, "./imagebuilder/cmd/gpuimage", "./agent/cmd/gpuagent", "./imagebuilder/cmd/gpurack-init",
			"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook", "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	cache := buildtest.DefaultImageCache()
	defer lockCache(t, cache.Dir)()
	entry, _ := cache.Get(t, key, func(dir string) {
		priv := filepath.Join(dir, "key.pem")
		RunGpuimage(t, root, gpuimage, "keygen", priv, filepath.Join(dir, "key.pub.pem"))
		start := time.Now()
		cache := build.DefaultCacheDir() // the .deb cache and apt lists stay warm between runs
		out := RunGpuimage(t, root, gpuimage, "build", prof, "--out", filepath.Join(dir, "store"), "--cache", cache, "--key", priv, "--src", root,
			"--agent-unit", agentUnit, "--k8s-dir", k8sDir)
		m := regexp.MustCompile(`(?m)^built (\S+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no 'built DIR' line in:\n%s", out)
		}
		t.Logf("built the %s image %s in %s", name, filepath.Base(m[1]), time.Since(start).Round(time.Second))
	})
	if entries.dir == nil {
		entries.dir = map[string]string{}
	}
	entries.dir[name] = entry
	return entry
}

// lockCache takes the image cache's build lock (a file lock on DIR/.build.lock) and
// returns its release. Test binaries of several packages (test/qemu,
// test/systemdhost) run at once under `go test ./...`; without it each would build
// the same missing image beside the other, both in gpuimage's one .deb cache, and
// keep only the first.
func lockCache(t testing.TB, dir string) (unlock func()) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("image cache: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".build.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("image cache lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		start := time.Now()
		t.Logf("image cache: another test binary holds %s (building an image); waiting", f.Name())
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			t.Fatalf("image cache lock %s: %v", f.Name(), err)
		}
		t.Logf("image cache: waited %s for the lock", time.Since(start).Round(time.Second))
	}
	return func() { f.Close() } // closing the file releases the lock
}

// Profile writes profiles/tiny.yaml, renamed name and with section appended, and
// the preloaded archives it names (the probe, CoreDNS from pinned source, the debug
// image) into a temporary directory, and locks it afresh there (the committed lock
// rots as the mirror drops versions). It returns the profile's path; its lock is beside it.
func Profile(t testing.TB, root, gpuimage, name, section string) string {
	t.Helper()
	tmp := t.TempDir()
	tiny, err := os.ReadFile(filepath.Join(root, "profiles", "tiny.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The probe image, preloaded (profile images:), for the pods the tests run.
	probe := exec.Command(filepath.Join(root, "hack", "probe-image.sh"), filepath.Join(tmp, "probe.tar"))
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("hack/probe-image.sh: %v\n%s", err, out)
	}
	// CoreDNS from pinned source (images/coredns), the cluster DNS Deployment's image.
	coredns := exec.Command(filepath.Join(root, "hack", "coredns-image.sh"), filepath.Join(tmp, "coredns.tar"))
	if out, err := coredns.CombinedOutput(); err != nil {
		t.Fatalf("hack/coredns-image.sh: %v\n%s", err, out)
	}
	// The break-glass debug image (images/debug), for kubectl debug node.
	debug := exec.Command(filepath.Join(root, "hack", "debug-image.sh"), filepath.Join(tmp, "debug.tar"))
	if out, err := debug.CombinedOutput(); err != nil {
		t.Fatalf("hack/debug-image.sh: %v\n%s", err, out)
	}
	src := strings.Replace(string(tiny), "name: tiny\n", "name: "+name+"\n", 1)
	src += "images:\n  - path: probe.tar\n    name: " + ProbeImage + "\n  - path: coredns.tar\n    name: " + clusterdns.Image +
		"\n  - path: debug.tar\n    name: " + DebugImage + "\n" + section
	// Data disks: every virtio disk (test/qemu's machines have none but those a test
	// gives them, MachineSpec.Disks), XFS from the image's xfsprogs (docs/storage.md).
	src = strings.Replace(src, "  - ca-certificates\n", "  - ca-certificates\n  - xfsprogs\n", 1)
	// An NFS server, for TestRack's node A to play the storage host of gpurack-shared
	// (test/qemu/shared_test.go): Debian's nfs-kernel-server and the kernel's nfsd.
	src = strings.Replace(src, "  - ca-certificates\n", "  - ca-certificates\n  - nfs-kernel-server\n", 1)
	src = strings.Replace(src, "  package: linux-image-amd64\n", "  package: linux-image-amd64\n  modules: [nfsd]\n", 1)
	src += "storage:\n  dataDisks:\n    - transport: virtio\n"
	prof := filepath.Join(tmp, name+".yaml")
	if err := os.WriteFile(prof, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	RunGpuimage(t, root, gpuimage, "lock", prof, "--cache", build.DefaultCacheDir())
	return prof
}

// RunGpuimage runs gpuimage with args in root and returns its output; a failure fails
// the test with that output.
func RunGpuimage(t testing.TB, root, gpuimage string, args ...string) string {
	t.Helper()
	cmd := exec.Command(gpuimage, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpuimage %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

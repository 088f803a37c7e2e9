package build

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

// Options are one build's inputs.
type Options struct {
	Profile  string // path of profiles/NAME.yaml
	Lock     string // path of the lock; default beside the profile
	Out      string // image store; the image lands in Out/<image-id>/
	Cache    string
	Key      string // ed25519 private key (PKIX PEM); default Cache/signing-key.pem, made once
	Src      string // repository root, for gpuagent and gpurack-init
	AgentBin string // a prebuilt gpuagent instead of building it from Src
	// AgentUnit is the gpuagent systemd unit the image installs and enables (required:
	// agent/systemd/gpuagent.service in the gpurack repository). The builder takes it as
	// given and looks for nothing in the agent's sources.
	AgentUnit string
	InitBin   string // a prebuilt gpurack-init instead of building it from Src
	// CDIHookBin and NvidiaRuntimeBin are prebuilt nvidia-cdi-hook and
	// nvidia-container-runtime instead of building them from the toolkit module that
	// Src's go.mod pins (GPU profiles only; the runtime for containerd 1.6 only).
	CDIHookBin, NvidiaRuntimeBin string
	K8sDir                       string // make k8s-bins output: bin/kubelet, bin/kube-proxy, bin/node_exporter, images/pause.tar, images/pause.tag
	// Epoch is SOURCE_DATE_EPOCH; 0 means the newest Release date in the lock, so the
	// same lock gives the same bytes without anyone choosing a time.
	Epoch    int64
	Reporter *Reporter
}

// Result is what a build produced.
type Result struct {
	Dir      string
	Manifest *manifest.Manifest
	Timings  map[string]time.Duration
}

// InitModules are loaded by gpurack-init: what it needs to mount the rootfs and reach
// the network on virtual machines and common server NICs.
var InitModules = []string{
	"loop", "squashfs", "overlay", "virtio_pci", "virtio_net", "virtio_blk", "virtio_rng",
	"e1000", "e1000e", "igb", "ixgbe", "i40e", "ice", "bnxt_en", "tg3", "mlx5_core",
}

// stages are the pipeline in order. Each reads what the stages before it left in
// imageBuild and adds its own results; Build reports stage n as "[n/len(stages)] name".
var stages = []struct {
	name string
	run  func(*imageBuild, context.Context) error
}{
	{"inputs", (*imageBuild).inputs},
	{"fetch .debs", (*imageBuild).fetch},
	{"kernel", (*imageBuild).kernel},
	{"nvidia kernel modules", (*imageBuild).kmod},
	{"rootfs (mmdebstrap)", (*imageBuild).rootfs},
	{"squashfs", (*imageBuild).squashfs},
	{"initramfs", (*imageBuild).initramfs},
	{"sbom", (*imageBuild).sbom},
	{"manifest + signature", (*imageBuild).sign},
	{"publish", (*imageBuild).publish},
}

// Build runs the whole pipeline.
//
// The image must not depend on who builds it: a umask of 077 once gave a rootfs whose
// /etc was 0700 under the same image id as a build under 022. The stages give every
// file and directory they write an explicit mode, and Build also sets the process
// umask to 022 while it runs (restoring it afterwards), so that what the child
// processes create (depmod, dpkg-deb, the module build, mksquashfs) is the same for
// every builder. The umask is process-wide: do not create files elsewhere in the
// process while Build runs if their mode matters.
func Build(ctx context.Context, o Options) (*Result, error) {
	defer pinUmask()()
	if o.Reporter == nil {
		o.Reporter = NewReporter(os.Stderr)
	}
	b := &imageBuild{o: o, rep: o.Reporter}
	defer b.cleanup()
	res := &Result{Timings: map[string]time.Duration{}}
	for i, st := range stages {
		b.rep.Stage(i+1, len(stages), st.name)
		start := time.Now()
		if err := st.run(b, ctx); err != nil {
			return nil, err
		}
		res.Timings[st.name] = time.Since(start)
		b.rep.Done()
	}
	res.Dir, res.Manifest = b.final, b.manifest
	return res, nil
}

// imageUmask is the umask Build runs under: directories 0755, files 0644 unless a
// stage says otherwise.
const imageUmask = 0o022

// pinUmask sets the process umask to imageUmask and returns the function that
// restores the previous one.
func pinUmask() (restore func()) {
	old := unix.Umask(imageUmask)
	return func() { unix.Umask(old) }
}

const moduleListPath = "/etc/gpurack-init/modules"

// lockEpoch is the newest Date of the lock's Release files.
func lockEpoch(l *profile.Lock) (int64, error) {
	var newest int64
	for _, r := range l.Release {
		t, err := time.Parse(time.RFC1123, r.Date)
		if err != nil {
			t, err = time.Parse(time.RFC1123Z, r.Date)
		}
		if err != nil {
			return 0, fmt.Errorf("lock release %s: date %q: %v; set SOURCE_DATE_EPOCH", r.Suite, r.Date, err)
		}
		newest = max(newest, t.Unix())
	}
	return newest, nil
}

// EpochFromEnv reads SOURCE_DATE_EPOCH, or returns 0.
func EpochFromEnv() (int64, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970 as a positive whole number", s)
	}
	return n, nil
}

func signingKey(path, cache string, rep *Reporter) (ed25519.PrivateKey, error) {
	if path != "" {
		return manifest.LoadPrivateKey(path)
	}
	path = filepath.Join(cache, "signing-key.pem")
	if _, err := os.Stat(path); err == nil {
		return manifest.LoadPrivateKey(path)
	}
	_, priv, err := manifest.GenerateKey()
	if err != nil {
		return nil, err
	}
	if err := manifest.WriteKeyPair(path, filepath.Join(cache, "signing-key.pub.pem"), priv); err != nil {
		return nil, err
	}
	rep.Logf("generated a signing key %s (public key %s); give gpuboot the public key", path, filepath.Join(cache, "signing-key.pub.pem"))
	return priv, nil
}

// GoBuild builds a gpurack binary reproducibly: -trimpath, no VCS stamp, the builder's
// version as its version. gpuagent links dynamically against glibc (go-nvml needs cgo
// and dlopen); gpurack-init is static.
func GoBuild(ctx context.Context, src, pkg, out string, cgo bool, version string) error {
	if src == "" {
		return fmt.Errorf("building %s needs the gpurack source tree: pass --src (the repository root) or a prebuilt binary", pkg)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X github.com/gpurack/gpurack/internal/buildinfo.Version="+version, "-o", out, pkg)
	cmd.Dir = src
	cgoEnv := "CGO_ENABLED=0"
	if cgo {
		cgoEnv = "CGO_ENABLED=1"
	}
	cmd.Env = append(os.Environ(), cgoEnv)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return nil
}

func checkInstalled(list string, want map[string]profile.LockedPackage) error {
	data, err := os.ReadFile(list)
	if err != nil {
		return fmt.Errorf("read the installed package list: %v", err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 {
			got[f[0]] = f[1]
		}
	}
	var diffs []string
	for _, lp := range want {
		if v, ok := got[lp.Name]; !ok {
			diffs = append(diffs, lp.Name+" "+lp.Version+" locked but not installed")
		} else if v != lp.Version {
			diffs = append(diffs, fmt.Sprintf("%s installed at %s, locked at %s", lp.Name, v, lp.Version))
		}
		delete(got, lp.Name)
	}
	for n, v := range got {
		diffs = append(diffs, n+" "+v+" installed but not locked")
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return fmt.Errorf("the root filesystem differs from the lock: %s", strings.Join(diffs, "; "))
	}
	return nil
}

func run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// writeWith creates path with mode 0644 whatever the umask, and fills it with fn.
func writeWith(path string, fn func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeFileMode writes path with exactly mode, whatever the umask.
func writeFileMode(path string, data []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// mkdirMode makes dir and any missing parents, and gives dir exactly mode whatever
// the umask (the parents are left as the umask makes them).
func mkdirMode(dir string, mode os.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

func copyPlain(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFileMode(dst, data, 0o644)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

package build

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/assemble"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/imagebuilder/kmod"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/buildinfo"
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
	InitBin  string // a prebuilt gpurack-init instead of building it from Src
	K8sDir   string // make k8s-bins output: bin/kubelet, images/pause.tar, images/pause.tag
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

const stages = 10

// Build runs the whole pipeline.
func Build(ctx context.Context, o Options) (*Result, error) {
	rep := o.Reporter
	if rep == nil {
		rep = NewReporter(os.Stderr)
	}
	res := &Result{Timings: map[string]time.Duration{}}
	stage := func(n int, name string) func() {
		rep.Stage(n, stages, name)
		t := time.Now()
		return func() { res.Timings[name] = time.Since(t); rep.Done() }
	}

	// 1. inputs
	end := stage(1, "inputs")
	p, err := profile.Load(o.Profile)
	if err != nil {
		return nil, err
	}
	if o.Lock == "" {
		o.Lock = profile.LockPath(o.Profile)
	}
	lockBytes, err := os.ReadFile(o.Lock)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s has no lock file %s: run gpuimage lock %s", o.Profile, o.Lock, o.Profile)
		}
		return nil, err
	}
	lock, err := profile.ParseLock(o.Lock, lockBytes)
	if err != nil {
		return nil, err
	}
	if lock.ProfileDigest != p.Digest() {
		return nil, fmt.Errorf("%s is stale: the profile changed since it was locked (lock has %s, profile is %s); run gpuimage lock %s",
			o.Lock, lock.ProfileDigest, p.Digest(), o.Profile)
	}
	if p.HasGPU() {
		if err := checkDriverInputs(p, lock); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Lock, err)
		}
	}
	epoch := o.Epoch
	if epoch == 0 {
		if epoch, err = lockEpoch(lock); err != nil {
			return nil, err
		}
	}
	if o.Cache == "" {
		o.Cache = DefaultCacheDir()
	}
	if err := os.MkdirAll(o.Cache, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(o.Cache, "work-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	key, err := signingKey(o.Key, o.Cache, rep)
	if err != nil {
		return nil, err
	}
	kubelet := filepath.Join(o.K8sDir, "bin", "kubelet")
	pause := filepath.Join(o.K8sDir, "images", "pause.tar")
	for _, f := range []string{kubelet, pause} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s is missing: run make k8s-bins (or set GPURACK_K8S_DIR to where it put the pinned Kubernetes binaries)", f)
		}
	}
	pauseTag := "registry.k8s.io/pause:3.10.1"
	if b, err := os.ReadFile(filepath.Join(o.K8sDir, "images", "pause.tag")); err == nil {
		pauseTag = strings.TrimSpace(string(b))
	}
	builder := buildinfo.String()
	agent, initBin := o.AgentBin, o.InitBin
	if agent == "" {
		agent = filepath.Join(work, "gpuagent")
		if err := GoBuild(ctx, o.Src, "./agent/cmd/gpuagent", agent, true, builder); err != nil {
			return nil, err
		}
	}
	if initBin == "" {
		initBin = filepath.Join(work, "gpurack-init")
		if err := GoBuild(ctx, o.Src, "./imagebuilder/cmd/gpurack-init", initBin, false, builder); err != nil {
			return nil, err
		}
	}
	bins := map[string]string{manifest.BinaryAgent: agent, manifest.BinaryKubelet: kubelet, "gpurack-init": initBin}
	binDigests := map[string]manifest.FileDigest{}
	idDigests := map[string]string{}
	for name, path := range bins {
		d, err := manifest.DigestFile(path)
		if err != nil {
			return nil, err
		}
		binDigests[name], idDigests[name] = d, d.SHA256
	}
	imageID := manifest.ImageID(p.Canonical(), lockBytes, builder, idDigests)
	rep.Logf("image %s: profile %s, %d packages, SOURCE_DATE_EPOCH=%d", imageID, p.Name, len(lock.Packages), epoch)
	end()

	// 2. fetch
	end = stage(2, "fetch .debs")
	bases, err := Bases(p)
	if err != nil {
		return nil, err
	}
	cache := &debcache.Cache{Dir: filepath.Join(o.Cache, "debs"), Log: rep.Logf}
	paths := map[string]profile.LockedPackage{}
	var kernelDeb string
	var kernelPkg profile.LockedPackage
	for i, lp := range lock.Packages {
		rep.Progress("%d/%d %s", i+1, len(lock.Packages), lp.Name)
		cache.Progress = func(name string, done, total int64) {
			rep.Progress("%d/%d %s %d/%d KiB", i+1, len(lock.Packages), name, done>>10, total>>10)
		}
		path, err := cache.Get(ctx, lp, bases)
		if err != nil {
			return nil, err
		}
		if apt.KernelImageRE.MatchString(lp.Name) {
			kernelDeb, kernelPkg = path, lp
			continue
		}
		paths[path] = lp
	}
	if kernelDeb == "" {
		return nil, fmt.Errorf("%s locks no linux-image package; re-run gpuimage lock %s", o.Lock, o.Profile)
	}
	buildDebs := map[string]string{}
	for _, lp := range lock.Build {
		path, err := cache.Get(ctx, lp, bases)
		if err != nil {
			return nil, err
		}
		buildDebs[lp.Name] = path
	}
	end()

	// 3. kernel
	end = stage(3, "kernel")
	kdir := filepath.Join(work, "kernel")
	if err := run(ctx, "", "dpkg-deb", "-x", kernelDeb, kdir); err != nil {
		return nil, err
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(kdir, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return nil, fmt.Errorf("%s holds %d kernels in /boot, want 1", kernelPkg.Name, len(vmlinuz))
	}
	kver := strings.TrimPrefix(filepath.Base(vmlinuz[0]), "vmlinuz-")
	modDir := filepath.Join(kdir, "lib", "modules", kver)
	if _, err := os.Stat(modDir); err != nil {
		// A merged-/usr kernel package (trixie) ships /usr/lib/modules; the
		// host's depmod -b looks under BASE/lib/modules.
		modDir = filepath.Join(kdir, "usr", "lib", "modules", kver)
		if err := os.Symlink("usr/lib", filepath.Join(kdir, "lib")); err != nil && !os.IsExist(err) {
			return nil, err
		}
	}
	if err := run(ctx, "", "depmod", "-b", kdir, kver); err != nil {
		return nil, err
	}
	deps, err := assemble.ParseModulesDep(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := assemble.ParseBuiltin(filepath.Join(modDir, "modules.builtin"))
	nodeMods, err := deps.Closure(rootfs.NodeModules, builtin)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", kver, err)
	}
	initMods, err := deps.Closure(InitModules, builtin)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", kver, err)
	}
	end()

	end = stage(4, "nvidia kernel modules")
	var driver *manifest.Driver
	var extraMods map[string]string
	if p.HasGPU() {
		kernelVermagic, err := kmod.Vermagic(filepath.Join(modDir, nodeMods[0]))
		if err != nil {
			return nil, err
		}
		out, vermagic, err := nvidiaModules(ctx, o.Cache, work, p, lock, kver, kernelPkg.Version, buildDebs, kernelVermagic, epoch, rep)
		if err != nil {
			return nil, err
		}
		extraMods = map[string]string{}
		for _, m := range kmod.Modules {
			if _, err := os.Stat(filepath.Join(out, m)); err == nil {
				extraMods[filepath.Join("updates", "dkms", m)] = filepath.Join(out, m)
			}
		}
		driver = &manifest.Driver{Version: p.GPU.Driver.Version, Flavor: p.GPU.Driver.Flavor, Vermagic: vermagic}
		rep.Logf("nvidia %s %s modules for %s: vermagic %q matches the kernel", p.GPU.Driver.Version, p.GPU.Driver.Flavor, kver, vermagic)
	}
	end()

	// 4. rootfs
	end = stage(5, "rootfs (mmdebstrap)")
	repo := filepath.Join(work, "repo")
	if err := debcache.WriteRepo(repo, p.Base.Suite, paths); err != nil {
		return nil, err
	}
	overlay := filepath.Join(work, "overlay")
	node := &rootfs.Node{
		ImageID: imageID, ProfileJSON: p.Canonical(), Kubelet: kubelet, PauseImage: pause, PauseTag: pauseTag,
		Agent: agent, AgentUnit: findAgentUnit(o.Src), KernelVersion: kver, KernelModules: modDir, Modules: nodeMods,
		InstalledList: filepath.Join(work, "installed.txt"), ExtraModules: extraMods,
	}
	if node.AgentUnit == "" {
		rep.Logf("gpuagent.service: agent/ ships no unit yet; the image carries gpurack-boot-report.service, which proves switch_root worked")
	}
	cmds, err := node.Write(overlay)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, lp := range paths {
		names = append(names, lp.Name)
	}
	sort.Strings(names)
	tarball := filepath.Join(work, "rootfs.tar")
	mm := &rootfs.Mmdebstrap{Suite: p.Base.Suite, Repo: repo, Packages: names, Overlay: overlay, Commands: cmds, Epoch: epoch, Out: tarball,
		Log: func(l string) { rep.Progress("%s", truncate(l, 100)) }}
	if err := mm.Run(ctx); err != nil {
		return nil, err
	}
	if err := checkInstalled(node.InstalledList, paths); err != nil {
		return nil, err
	}
	end()

	// 5. squashfs
	end = stage(6, "squashfs")
	stageDir := filepath.Join(o.Out, ".building-"+imageID)
	os.RemoveAll(stageDir)
	if err := os.MkdirAll(stageDir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(stageDir)
	if err := assemble.Squashfs(tarball, filepath.Join(stageDir, manifest.ArtifactRootfs), epoch); err != nil {
		return nil, err
	}
	os.Remove(tarball)
	rootDigest, err := manifest.DigestFile(filepath.Join(stageDir, manifest.ArtifactRootfs))
	if err != nil {
		return nil, err
	}
	end()

	// 6. initramfs
	end = stage(7, "initramfs")
	entries := []assemble.Entry{
		{Path: "init", Mode: assemble.ModeReg | 0o755, Source: initBin},
		{Path: "dev/console", Mode: assemble.ModeChr | 0o600, Major: 5, Minor: 1},
		{Path: "dev/kmsg", Mode: assemble.ModeChr | 0o644, Major: 1, Minor: 11},
		{Path: "proc", Mode: assemble.ModeDir | 0o755}, {Path: "sys", Mode: assemble.ModeDir | 0o755},
		{Path: "run", Mode: assemble.ModeDir | 0o755}, {Path: "newroot", Mode: assemble.ModeDir | 0o755},
		{Path: "tmp", Mode: assemble.ModeDir | 0o1777},
	}
	var order strings.Builder
	for _, m := range initMods {
		rel := filepath.Join("lib/modules", kver, m)
		entries = append(entries, assemble.Entry{Path: rel, Mode: assemble.ModeReg | 0o644, Source: filepath.Join(modDir, m)})
		order.WriteString("/" + rel + "\n")
	}
	entries = append(entries, assemble.Entry{Path: strings.TrimPrefix(moduleListPath, "/"), Mode: assemble.ModeReg | 0o644, Data: []byte(order.String())})
	if err := writeWith(filepath.Join(stageDir, manifest.ArtifactInitrd), func(f *os.File) error { return assemble.WriteCpio(f, entries, epoch) }); err != nil {
		return nil, err
	}
	if err := copyPlain(vmlinuz[0], filepath.Join(stageDir, manifest.ArtifactKernel)); err != nil {
		return nil, err
	}
	args := append(append([]string{}, p.Boot.KernelArgs...), "gpurack.rootfs.sha256="+rootDigest.SHA256)
	if err := os.WriteFile(filepath.Join(stageDir, manifest.ArtifactCmdline), []byte(strings.Join(args, " ")+"\n"), 0o644); err != nil {
		return nil, err
	}
	end()

	// 7. SBOM
	end = stage(8, "sbom")
	var sbomPkgs []manifest.Package
	for _, lp := range lock.Packages {
		sbomPkgs = append(sbomPkgs, manifest.Package{Name: lp.Name, Version: lp.Version, Arch: lp.Architecture, SHA256: lp.SHA256})
	}
	sbom, err := manifest.SBOM(imageID, "gpurack-"+p.Name, time.Unix(epoch, 0), sbomPkgs)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(stageDir, manifest.ArtifactSBOM), sbom, 0o644); err != nil {
		return nil, err
	}
	end()

	// 8. manifest
	end = stage(9, "manifest + signature")
	m := &manifest.Manifest{
		SchemaVersion: manifest.SchemaVersion, ImageID: imageID, Profile: p.Name,
		ProfileDigest: p.Digest(), LockDigest: "sha256:" + sha256Hex(lockBytes), BuilderVersion: builder,
		SourceDateEpoch: epoch, Kernel: manifest.Kernel{Version: kver, Package: kernelPkg.Name},
		KubernetesVersion: p.Kubernetes.Version, Binaries: binDigests, Driver: driver,
	}
	for _, name := range []string{manifest.ArtifactKernel, manifest.ArtifactInitrd, manifest.ArtifactRootfs, manifest.ArtifactCmdline, manifest.ArtifactSBOM} {
		a, err := manifest.ArtifactOf(stageDir, name)
		if err != nil {
			return nil, err
		}
		m.Artifacts = append(m.Artifacts, a)
	}
	if err := manifest.WriteSigned(stageDir, m, key); err != nil {
		return nil, err
	}
	end()

	// 9. publish
	end = stage(10, "publish")
	final := filepath.Join(o.Out, imageID)
	os.RemoveAll(final)
	if err := os.Rename(stageDir, final); err != nil {
		return nil, err
	}
	end()
	res.Dir, res.Manifest = final, m
	return res, nil
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

func findAgentUnit(src string) string {
	if src == "" {
		return ""
	}
	var found string
	filepath.WalkDir(filepath.Join(src, "agent"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "gpuagent.service" && found == "" {
			found = path
		}
		return nil
	})
	return found
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

func writeWith(path string, fn func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copyPlain(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

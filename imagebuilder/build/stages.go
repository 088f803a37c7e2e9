package build

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/assemble"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/imagebuilder/kmod"
	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/buildinfo"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

// imageBuild is one run of the pipeline: its options and what each stage found or
// made, in stage order. A stage reads only fields set by the stages before it.
type imageBuild struct {
	o   Options
	rep *Reporter

	// inputs
	work      string // scratch directory under the cache, removed at the end
	p         *profile.Profile
	lock      *profile.Lock
	lockBytes []byte
	epoch     int64
	key       ed25519.PrivateKey
	kubelet   string
	kubeProxy string
	// nodeExporter is node_exporter (make k8s-bins), shipped in every node image.
	nodeExporter string
	pause        string // pause image archive
	pauseTag     string
	builder      string // gpuimage's own version
	agent        string // gpuagent binary
	initBin      string // gpurack-init binary
	gpuRT        rootfs.GPURuntime
	cdiHook      string // nvidia-cdi-hook binary, GPU images only
	nvRuntime    string // nvidia-container-runtime binary, containerd 1.6 GPU images only
	bins         map[string]manifest.FileDigest
	archives     []*ociarchive.File // the profile's image archives, checked
	imageID      string

	// fetch
	debs      map[string]profile.LockedPackage // cached .deb path → package, kernel excluded
	kernelDeb string
	kernelPkg profile.LockedPackage
	buildDebs map[string]string // build-only package name → cached .deb path

	// kernel
	vmlinuz  string
	kver     string
	modDir   string // the extracted kernel's lib/modules/<kver>
	nodeMods []string
	initMods []string

	// nvidia kernel modules
	driver    *manifest.Driver
	extraMods map[string]string

	// rootfs
	tarball string

	// squashfs onwards
	stageDir   string // Out/.building-<id>, renamed to final when complete
	rootDigest manifest.FileDigest

	// manifest, publish
	manifest *manifest.Manifest
	final    string
}

// cleanup removes the scratch and staging directories (a published image has left
// the staging directory already).
func (b *imageBuild) cleanup() {
	if b.work != "" {
		os.RemoveAll(b.work)
	}
	if b.stageDir != "" {
		os.RemoveAll(b.stageDir)
	}
}

// inputs reads and checks the profile, its lock and everything else the image is made
// of, and derives the image id from them.
func (b *imageBuild) inputs(ctx context.Context) error {
	if err := b.readProfileAndLock(); err != nil {
		return err
	}
	if err := checkAgentUnit(b.o.AgentUnit); err != nil {
		return err
	}
	archives, err := ImageArchives(b.o.Profile, b.p)
	if err != nil {
		return err
	}
	b.archives = archives
	o := &b.o
	if o.Cache == "" {
		o.Cache = DefaultCacheDir()
	}
	if err := mkdirMode(o.Cache, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(o.Cache, "work-")
	if err != nil {
		return err
	}
	b.work = work
	if b.key, err = signingKey(o.Key, o.Cache, b.rep); err != nil {
		return err
	}
	if err := b.hostInputs(); err != nil {
		return err
	}
	if err := b.binaries(ctx); err != nil {
		return err
	}
	unit, err := os.ReadFile(b.o.AgentUnit)
	if err != nil {
		return fmt.Errorf("--agent-unit: %w", err)
	}
	b.imageID = manifest.ImageID(b.p.Canonical(), b.lockBytes, b.builder, bundledDigests(b.bins, unit), archiveDigests(b.archives))
	b.rep.Logf("image %s: profile %s, %d packages, %d image archives, SOURCE_DATE_EPOCH=%d", b.imageID, b.p.Name, len(b.lock.Packages), len(b.archives), b.epoch)
	return nil
}

// readProfileAndLock loads the profile and its lock, refuses a stale lock or an
// incomplete driver, and settles SOURCE_DATE_EPOCH.
func (b *imageBuild) readProfileAndLock() error {
	o := &b.o
	p, err := profile.Load(o.Profile)
	if err != nil {
		return err
	}
	if o.Lock == "" {
		o.Lock = profile.LockPath(o.Profile)
	}
	lockBytes, err := os.ReadFile(o.Lock)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s has no lock file %s: run gpuimage lock %s", o.Profile, o.Lock, o.Profile)
		}
		return err
	}
	lock, err := profile.ParseLock(o.Lock, lockBytes)
	if err != nil {
		return err
	}
	if lock.ProfileDigest != p.Digest() {
		return fmt.Errorf("%s is stale: the profile changed since it was locked (lock has %s, profile is %s); run gpuimage lock %s",
			o.Lock, lock.ProfileDigest, p.Digest(), o.Profile)
	}
	if p.HasDriver() {
		if err := checkDriverInputs(p, lock); err != nil {
			return fmt.Errorf("%s: %w", o.Lock, err)
		}
	}
	epoch := o.Epoch
	if epoch == 0 {
		if epoch, err = lockEpoch(lock); err != nil {
			return err
		}
	}
	b.p, b.lock, b.lockBytes, b.epoch = p, lock, lockBytes, epoch
	return nil
}

// hostInputs finds the pinned Kubernetes files.
func (b *imageBuild) hostInputs() error {
	o := &b.o
	b.kubelet = filepath.Join(o.K8sDir, "bin", "kubelet")
	b.kubeProxy = filepath.Join(o.K8sDir, "bin", "kube-proxy")
	b.nodeExporter = filepath.Join(o.K8sDir, "bin", "node_exporter")
	b.pause = filepath.Join(o.K8sDir, "images", "pause.tar")
	for _, f := range []string{b.kubelet, b.kubeProxy, b.nodeExporter, b.pause} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s is missing: run make k8s-bins (or set GPURACK_K8S_DIR to where it put the pinned Kubernetes binaries)", f)
		}
	}
	b.pauseTag = "registry.k8s.io/pause:3.10.1"
	if data, err := os.ReadFile(filepath.Join(o.K8sDir, "images", "pause.tag")); err == nil {
		b.pauseTag = strings.TrimSpace(string(data))
	}
	return nil
}

// agentUnitName is the unit's entry among the image id's bundled-file digests.
const agentUnitName = "gpuagent.service"

// bundledDigests are the digests the image id covers besides the profile and the lock:
// the bundled binaries and the gpuagent unit. The unit ships like the binaries, so two
// builds that differ only in the unit must not share an id.
func bundledDigests(bins map[string]manifest.FileDigest, unit []byte) map[string]string {
	ids := map[string]string{agentUnitName: fmt.Sprintf("%x", sha256.Sum256(unit))}
	for name, d := range bins {
		ids[name] = d.SHA256
	}
	return ids
}

// checkAgentUnit fails, saying what to pass, unless unit names a regular file.
func checkAgentUnit(unit string) error {
	const what = "the gpuagent systemd unit the image installs and enables (agent/systemd/gpuagent.service in the gpurack repository)"
	if unit == "" {
		return fmt.Errorf("no gpuagent unit given: pass --agent-unit with %s", what)
	}
	st, err := os.Stat(unit)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--agent-unit %s does not exist; pass %s", unit, what)
	}
	if err != nil {
		return fmt.Errorf("--agent-unit: %w; pass %s", err, what)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("--agent-unit %s is not a regular file; pass %s", unit, what)
	}
	return nil
}

// binaries builds (or takes) gpuagent and gpurack-init and digests the binaries the
// image id covers.
func (b *imageBuild) binaries(ctx context.Context) error {
	o := &b.o
	b.builder = buildinfo.String()
	b.agent, b.initBin = o.AgentBin, o.InitBin
	if b.agent == "" {
		b.agent = filepath.Join(b.work, "gpuagent")
		if err := GoBuild(ctx, o.Src, "./agent/cmd/gpuagent", b.agent, true, b.builder); err != nil {
			return err
		}
	}
	if b.initBin == "" {
		b.initBin = filepath.Join(b.work, "gpurack-init")
		if err := GoBuild(ctx, o.Src, "./imagebuilder/cmd/gpurack-init", b.initBin, false, b.builder); err != nil {
			return err
		}
	}
	bundled := map[string]string{manifest.BinaryAgent: b.agent, manifest.BinaryKubelet: b.kubelet, manifest.BinaryKubeProxy: b.kubeProxy,
		manifest.BinaryNodeExporter: b.nodeExporter, "gpurack-init": b.initBin}
	if err := b.gpuRuntimeBinaries(ctx, bundled); err != nil {
		return err
	}
	b.bins = map[string]manifest.FileDigest{}
	for name, path := range bundled {
		d, err := manifest.DigestFile(path)
		if err != nil {
			return err
		}
		b.bins[name] = d
	}
	return nil
}

// nvidiaToolkit is the nvidia-container-toolkit module whose commands GPU images ship,
// at the version go.mod pins (go.mod's tool directives keep their dependencies' sums).
const nvidiaToolkit = "github.com/NVIDIA/nvidia-container-toolkit"

// gpuRuntimeBinaries picks the GPU container runtime from the profile and the locked
// containerd (rootfs.GPURuntimeFor) and builds (or takes) what it ships, from the
// toolkit module pinned in gpurack's go.mod: nvidia-cdi-hook for every GPU image,
// nvidia-container-runtime for containerd 1.6 ones. They join bundled, so the image id
// covers them.
func (b *imageBuild) gpuRuntimeBinaries(ctx context.Context, bundled map[string]string) error {
	containerd := ""
	if lp := b.lock.Find("containerd"); lp != nil {
		containerd = lp.Version
	}
	rt, err := rootfs.GPURuntimeFor(b.p.GPU != nil, containerd)
	if err != nil {
		return fmt.Errorf("profile %s: %w", b.p.Name, err)
	}
	b.gpuRT = rt
	if rt == rootfs.GPURuntimeNone {
		return nil
	}
	o := &b.o
	b.cdiHook = o.CDIHookBin
	if b.cdiHook == "" {
		b.cdiHook = filepath.Join(b.work, "nvidia-cdi-hook")
		if err := GoBuild(ctx, o.Src, nvidiaToolkit+"/cmd/nvidia-cdi-hook", b.cdiHook, true, b.builder); err != nil {
			return err
		}
	}
	bundled["nvidia-cdi-hook"] = b.cdiHook
	if rt != rootfs.GPURuntimeNvidiaCDI {
		return nil
	}
	b.nvRuntime = o.NvidiaRuntimeBin
	if b.nvRuntime == "" {
		b.nvRuntime = filepath.Join(b.work, "nvidia-container-runtime")
		// cgo: the runtime's CUDA compatibility check dlopens libcuda.
		if err := GoBuild(ctx, o.Src, nvidiaToolkit+"/cmd/nvidia-container-runtime", b.nvRuntime, true, b.builder); err != nil {
			return err
		}
	}
	bundled["nvidia-container-runtime"] = b.nvRuntime
	return nil
}

// fetchDebs puts every package of pkgs into the .deb cache under cacheDir (verified),
// with progress on rep, and gives each one's path to got, in order. It returns the
// cache, for more fetches from the same bases.
func fetchDebs(ctx context.Context, rep *Reporter, cacheDir string, bases []string, pkgs []profile.LockedPackage,
	got func(path string, lp profile.LockedPackage)) (*debcache.Cache, error) {
	cache := &debcache.Cache{Dir: filepath.Join(cacheDir, "debs"), Log: rep.Logf}
	for i, lp := range pkgs {
		rep.Progress("%d/%d %s", i+1, len(pkgs), lp.Name)
		cache.Progress = func(name string, done, total int64) {
			rep.Progress("%d/%d %s %d/%d KiB", i+1, len(pkgs), name, done>>10, total>>10)
		}
		path, err := cache.Get(ctx, lp, bases)
		if err != nil {
			return nil, err
		}
		got(path, lp)
	}
	return cache, nil
}

// fetch puts every locked .deb into the cache (verified), setting the kernel package
// and the build-only inputs apart.
func (b *imageBuild) fetch(ctx context.Context) error {
	bases, err := Bases(b.p)
	if err != nil {
		return err
	}
	b.debs = map[string]profile.LockedPackage{}
	cache, err := fetchDebs(ctx, b.rep, b.o.Cache, bases, b.lock.Packages, func(path string, lp profile.LockedPackage) {
		if apt.KernelImageRE.MatchString(lp.Name) {
			b.kernelDeb, b.kernelPkg = path, lp
			return
		}
		b.debs[path] = lp
	})
	if err != nil {
		return err
	}
	if b.kernelDeb == "" {
		return fmt.Errorf("%s locks no linux-image package; re-run gpuimage lock %s", b.o.Lock, b.o.Profile)
	}
	b.buildDebs = map[string]string{}
	for _, lp := range b.lock.Build {
		path, err := cache.Get(ctx, lp, bases)
		if err != nil {
			return err
		}
		b.buildDebs[lp.Name] = path
	}
	return nil
}

// kernel extracts (does not install) the locked kernel, runs depmod over it and
// computes the module closures of the root filesystem and of the initramfs.
func (b *imageBuild) kernel(ctx context.Context) error {
	kdir := filepath.Join(b.work, "kernel")
	if err := run(ctx, "", "dpkg-deb", "-x", b.kernelDeb, kdir); err != nil {
		return err
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(kdir, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return fmt.Errorf("%s holds %d kernels in /boot, want 1", b.kernelPkg.Name, len(vmlinuz))
	}
	b.vmlinuz = vmlinuz[0]
	b.kver = strings.TrimPrefix(filepath.Base(b.vmlinuz), "vmlinuz-")
	b.modDir = filepath.Join(kdir, "lib", "modules", b.kver)
	if _, err := os.Stat(b.modDir); err != nil {
		// A merged-/usr kernel package (trixie) ships /usr/lib/modules; the
		// host's depmod -b looks under BASE/lib/modules.
		b.modDir = filepath.Join(kdir, "usr", "lib", "modules", b.kver)
		if err := os.Symlink("usr/lib", filepath.Join(kdir, "lib")); err != nil && !os.IsExist(err) {
			return err
		}
	}
	if err := run(ctx, "", "depmod", "-b", kdir, b.kver); err != nil {
		return err
	}
	deps, err := assemble.ParseModulesDep(filepath.Join(b.modDir, "modules.dep"))
	if err != nil {
		return err
	}
	builtin := assemble.ParseBuiltin(filepath.Join(b.modDir, "modules.builtin"))
	// The initramfs loads its list by hand, in this order, and needs no softdeps
	// (gpurack-init stops on a module that fails); the node's modprobe follows
	// softdeps, so the rootfs ships what they name (libcrc32c's crc32c for nf_tables).
	if b.initMods, err = deps.Closure(InitModules, builtin); err != nil {
		return fmt.Errorf("kernel %s: %w", b.kver, err)
	}
	if err := deps.ReadSoftdeps(filepath.Join(b.modDir, "modules.softdep"), filepath.Join(b.modDir, "modules.alias")); err != nil {
		return fmt.Errorf("kernel %s: %w", b.kver, err)
	}
	if b.nodeMods, err = deps.Closure(append(slices.Clip(rootfs.NodeModules), b.p.Kernel.Modules...), builtin); err != nil {
		return fmt.Errorf("kernel %s: %w", b.kver, err)
	}
	return nil
}

// kmod builds (or takes from the cache) the NVIDIA modules of a GPU profile and
// checks their vermagic against the kernel; a profile without a driver skips it.
func (b *imageBuild) kmod(ctx context.Context) error {
	if !b.p.HasDriver() {
		return nil
	}
	p := b.p
	kernelVermagic, err := kmod.Vermagic(filepath.Join(b.modDir, b.nodeMods[0]))
	if err != nil {
		return err
	}
	out, vermagic, err := nvidiaModules(ctx, b.o.Cache, b.work, p, b.lock, b.kver, b.kernelPkg.Version, b.buildDebs, kernelVermagic, b.epoch, b.rep)
	if err != nil {
		return err
	}
	b.extraMods = map[string]string{}
	for _, m := range kmod.Modules {
		if _, err := os.Stat(filepath.Join(out, m)); err == nil {
			b.extraMods[filepath.Join("updates", "dkms", m)] = filepath.Join(out, m)
		}
	}
	b.driver = &manifest.Driver{Version: p.GPU.Driver.Version, Flavor: p.GPU.Driver.Flavor, Vermagic: vermagic}
	b.rep.Logf("nvidia %s %s modules for %s: vermagic %q matches the kernel", p.GPU.Driver.Version, p.GPU.Driver.Flavor, b.kver, vermagic)
	return nil
}

// rootfs installs exactly the locked .debs with mmdebstrap into a tarball, with the
// node's files laid over the tree, and checks that dpkg installed what the lock says.
func (b *imageBuild) rootfs(ctx context.Context) error {
	repo := filepath.Join(b.work, "repo")
	if err := debcache.WriteRepo(repo, b.p.Base.Suite, b.debs); err != nil {
		return err
	}
	overlay := filepath.Join(b.work, "overlay")
	installed := filepath.Join(b.work, "installed.txt")
	cmds, err := b.customize(overlay, installed)
	if err != nil {
		return err
	}
	var names []string
	for _, lp := range b.debs {
		names = append(names, lp.Name)
	}
	sort.Strings(names)
	b.tarball = filepath.Join(b.work, "rootfs.tar")
	mm := &rootfs.Mmdebstrap{Suite: b.p.Base.Suite, Repo: repo, Packages: names, Overlay: overlay, Commands: cmds, Epoch: b.epoch, Out: b.tarball,
		Log: func(l string) { b.rep.Progress("%s", truncate(l, 100)) }}
	if err := mm.Run(ctx); err != nil {
		return err
	}
	return checkInstalled(installed, b.debs)
}

// customize lays the node's own files out in overlay (which mmdebstrap copies over
// the tree with cp -a, modes included) and returns the customize-hook commands; the
// last of them writes dpkg's installed list to installed.
func (b *imageBuild) customize(overlay, installed string) ([]string, error) {
	node := &rootfs.Node{
		ImageID: b.imageID, ProfileJSON: b.p.Canonical(), Kubelet: b.kubelet, KubeProxy: b.kubeProxy, NodeExporter: b.nodeExporter, PauseImage: b.pause, PauseTag: b.pauseTag,
		Agent: b.agent, AgentUnit: b.o.AgentUnit, KernelVersion: b.kver, KernelModules: b.modDir, Modules: b.nodeMods,
		InstalledList: installed, ExtraModules: b.extraMods, Images: nodeArchives(b.archives),
		GPURuntime: b.gpuRT, CDIHook: b.cdiHook, NvidiaRuntime: b.nvRuntime,
	}
	return node.Write(overlay)
}

// squashfs makes rootfs.squashfs from mmdebstrap's tarball in the staging directory.
func (b *imageBuild) squashfs(ctx context.Context) error {
	if err := b.makeStageDir(); err != nil {
		return err
	}
	sqfs := filepath.Join(b.stageDir, manifest.ArtifactRootfs)
	if err := assemble.Squashfs(b.tarball, sqfs, b.epoch); err != nil {
		return err
	}
	os.Remove(b.tarball)
	if err := os.Chmod(sqfs, 0o644); err != nil {
		return err
	}
	var err error
	b.rootDigest, err = manifest.DigestFile(sqfs)
	return err
}

// makeStageDir makes an empty Out/.building-<id>, mode 0755: the directory that
// becomes Out/<id> once every artifact is in it.
func (b *imageBuild) makeStageDir() error {
	b.stageDir = filepath.Join(b.o.Out, ".building-"+b.imageID)
	os.RemoveAll(b.stageDir)
	return mkdirMode(b.stageDir, 0o755)
}

// initramfs writes initrd.img (gpurack-init as /init, the initramfs module closure and
// its load order), vmlinuz and the kernel command line with the rootfs digest.
func (b *imageBuild) initramfs(ctx context.Context) error {
	entries := initramfsEntries(b.initBin, b.kver, b.modDir, b.initMods)
	if err := writeWith(filepath.Join(b.stageDir, manifest.ArtifactInitrd), func(f *os.File) error { return assemble.WriteCpio(f, entries, b.epoch) }); err != nil {
		return err
	}
	if err := copyPlain(b.vmlinuz, filepath.Join(b.stageDir, manifest.ArtifactKernel)); err != nil {
		return err
	}
	args := append(append([]string{}, b.p.Boot.KernelArgs...), "gpurack.rootfs.sha256="+b.rootDigest.SHA256)
	return writeFileMode(filepath.Join(b.stageDir, manifest.ArtifactCmdline), []byte(strings.Join(args, " ")+"\n"), 0o644)
}

// initramfsEntries are the files of the initramfs; every mode is given here, none
// comes from the builder's files.
func initramfsEntries(initBin, kver, modDir string, initMods []string) []assemble.Entry {
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
	return append(entries, assemble.Entry{Path: strings.TrimPrefix(moduleListPath, "/"), Mode: assemble.ModeReg | 0o644, Data: []byte(order.String())})
}

// sbom writes the SPDX document of the lock's package set.
func (b *imageBuild) sbom(ctx context.Context) error {
	var pkgs []manifest.Package
	for _, lp := range b.lock.Packages {
		pkgs = append(pkgs, manifest.Package{Name: lp.Name, Version: lp.Version, Arch: lp.Architecture, SHA256: lp.SHA256})
	}
	sbom, err := manifest.SBOM(b.imageID, "gpurack-"+b.p.Name, time.Unix(b.epoch, 0), pkgs)
	if err != nil {
		return err
	}
	return writeFileMode(filepath.Join(b.stageDir, manifest.ArtifactSBOM), sbom, 0o644)
}

// sign writes manifest.json over every artifact and its ed25519 signature.
func (b *imageBuild) sign(ctx context.Context) error {
	p := b.p
	m := &manifest.Manifest{
		SchemaVersion: manifest.SchemaVersion, ImageID: b.imageID, Profile: p.Name,
		ProfileDigest: p.Digest(), LockDigest: "sha256:" + sha256Hex(b.lockBytes), BuilderVersion: b.builder,
		SourceDateEpoch: b.epoch, Kernel: manifest.Kernel{Version: b.kver, Package: b.kernelPkg.Name},
		KubernetesVersion: p.Kubernetes.Version, Binaries: b.bins, Driver: b.driver, Images: manifestArchives(b.archives),
	}
	if p.Simulated() {
		m.GPUSimulator = p.GPU.Simulator
	}
	for _, name := range []string{manifest.ArtifactKernel, manifest.ArtifactInitrd, manifest.ArtifactRootfs, manifest.ArtifactCmdline, manifest.ArtifactSBOM} {
		a, err := manifest.ArtifactOf(b.stageDir, name)
		if err != nil {
			return err
		}
		m.Artifacts = append(m.Artifacts, a)
	}
	if err := manifest.WriteSigned(b.stageDir, m, b.key); err != nil {
		return err
	}
	b.manifest = m
	return nil
}

// publish renames the complete staging directory to Out/<image-id>, replacing an
// earlier build of the same id.
func (b *imageBuild) publish(ctx context.Context) error {
	final := filepath.Join(b.o.Out, b.imageID)
	os.RemoveAll(final)
	if err := os.Rename(b.stageDir, final); err != nil {
		return err
	}
	b.final = final
	return nil
}

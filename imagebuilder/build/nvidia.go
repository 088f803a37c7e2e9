package build

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/imagebuilder/kmod"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/profile"
)

// kmodRoot holds the module build chroots, at a fixed path so that paths compiled into
// the modules are the same on every build host.
const kmodRoot = "/var/tmp/gpurack-kmod"

// checkDriverInputs fails, naming what is missing, unless the lock holds the driver's
// userspace, firmware and module sources at the profile's driver version.
func checkDriverInputs(p *profile.Profile, l *profile.Lock) error {
	v := p.GPU.Driver.Version + "-"
	need := map[string]bool{"libnvidia-ml1": false, "nvidia-smi": false, "firmware-nvidia-gsp": false, "nvidia-kernel-support": false}
	for _, lp := range l.Packages {
		if _, ok := need[lp.Name]; ok {
			if !strings.HasPrefix(lp.Version, v) {
				return fmt.Errorf("%s is locked at %s but the driver is %s: the kernel modules, userspace and firmware must be one version (re-lock)", lp.Name, lp.Version, p.GPU.Driver.Version)
			}
			need[lp.Name] = true
		}
	}
	for name, ok := range need {
		if !ok {
			what := "driver userspace"
			if name == "firmware-nvidia-gsp" {
				what = "GSP firmware"
			}
			return fmt.Errorf("missing %s: %s %s* is not locked; add it to the profile's packages and re-lock", what, name, v)
		}
	}
	if !hasBuild(l, apt.DKMSPackage(p)) {
		return fmt.Errorf("missing module sources: %s %s* is not among the lock's build inputs (re-lock)", apt.DKMSPackage(p), v)
	}
	return nil
}

func hasBuild(l *profile.Lock, name string) bool {
	for _, lp := range l.Build {
		if lp.Name == name {
			return true
		}
	}
	return false
}

// nvidiaModules returns the directory with the built modules (cached by kernel ×
// driver × flavor) and their vermagic, checked against the kernel's. On a cache miss
// it makes the build chroot of the profile's own suite with mmdebstrap from the lock's
// build inputs, unpacks the DKMS sources into it and compiles there, so the compiler is
// the suite's (trixie's kernel needs trixie's gcc-14), whatever the host runs.
func nvidiaModules(ctx context.Context, cache, work string, p *profile.Profile, l *profile.Lock, kver, kpkgVersion string, debs map[string]string, kernelVermagic string, epoch int64, rep *Reporter) (string, string, error) {
	key := kmod.Key{Kernel: kver, Driver: p.GPU.Driver.Version, Flavor: p.GPU.Driver.Flavor}
	out := filepath.Join(cache, "kmod", key.String())
	if _, err := os.Stat(filepath.Join(out, kmod.Modules[0])); err != nil {
		if err := buildModules(ctx, work, p, l, key, kpkgVersion, debs, out, epoch, rep); err != nil {
			os.RemoveAll(out)
			return "", "", err
		}
	} else {
		rep.Logf("NVIDIA %s %s modules for %s: cached in %s", key.Driver, key.Flavor, kver, out)
	}
	vms := map[string]string{}
	for _, m := range kmod.Modules {
		f := filepath.Join(out, m)
		if _, err := os.Stat(f); err != nil {
			continue
		}
		vm, err := kmod.Vermagic(f)
		if err != nil {
			return "", "", err
		}
		vms[m] = vm
	}
	if err := kmod.CheckVermagic(kernelVermagic, vms); err != nil {
		return "", "", err
	}
	return out, kernelVermagic, nil
}

func buildModules(ctx context.Context, work string, p *profile.Profile, l *profile.Lock, key kmod.Key, kpkgVersion string, debs map[string]string, out string, epoch int64, rep *Reporter) error {
	if err := os.MkdirAll(kmodRoot, 0o755); err != nil {
		return err
	}
	// One build per key at a time: the chroot path is fixed.
	lockf, err := os.OpenFile(filepath.Join(kmodRoot, key.String()+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lockf.Close()
	if err := unix.Flock(int(lockf.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	root := filepath.Join(kmodRoot, key.String())
	os.RemoveAll(root)
	defer os.RemoveAll(root)

	dkms := apt.DKMSPackage(p)
	chroot := map[string]profile.LockedPackage{}
	var names []string
	for _, lp := range l.Build {
		if lp.Name == dkms {
			continue
		}
		chroot[debs[lp.Name]] = lp
		names = append(names, lp.Name)
	}
	sort.Strings(names)
	repo := filepath.Join(work, "kmod-repo")
	if err := debcache.WriteRepo(repo, p.Base.Suite, chroot); err != nil {
		return err
	}
	rep.Logf("module build chroot: %s %s with %d locked packages (mmdebstrap)", p.Base.Distro, p.Base.Suite, len(names))
	mm := &rootfs.Mmdebstrap{Suite: p.Base.Suite, Repo: repo, Packages: names, Epoch: epoch, Out: root, Directory: true,
		Log: func(line string) { rep.Progress("%s", truncate(line, 100)) }}
	if err := mm.Run(ctx); err != nil {
		return fmt.Errorf("module build chroot: %w", err)
	}
	if err := run(ctx, "", "dpkg-deb", "-x", debs[dkms], root); err != nil {
		return err
	}
	srcs, _ := filepath.Glob(filepath.Join(root, "usr/src", "nvidia-current*-"+p.GPU.Driver.Version))
	if len(srcs) != 1 {
		return fmt.Errorf("%s unpacked %d driver source trees under /usr/src, want 1 (re-lock)", dkms, len(srcs))
	}
	rep.Logf("compiling NVIDIA %s %s modules for %s in the %s chroot (minutes; cached afterwards in %s)", key.Driver, key.Flavor, key.Kernel, p.Base.Suite, out)
	env := []string{"SOURCE_DATE_EPOCH=" + strconv.FormatInt(epoch, 10)}
	start, lastLog := time.Now(), time.Now()
	progress := func(objects int) {
		rep.Progress("compiled %d objects (%s)", objects, time.Since(start).Round(time.Second))
		if !rep.TTY && time.Since(lastLog) >= time.Minute {
			lastLog = time.Now()
			rep.Logf("still compiling: %d objects in %s", objects, time.Since(start).Round(time.Second))
		}
	}
	if err := kmod.Build(ctx, key, kpkgVersion, root, strings.TrimPrefix(srcs[0], root), out, env, progress); err != nil {
		return err
	}
	rep.Logf("compiled the NVIDIA modules in %s", time.Since(start).Round(time.Second))
	return nil
}

package build

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/kmod"
	"github.com/gpurack/gpurack/internal/profile"
)

// kmodRoot is the fixed path module builds run under, so that paths compiled into the
// modules are the same on every build host.
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
// driver × flavor) and their vermagic, checked against the kernel's.
func nvidiaModules(ctx context.Context, cache string, p *profile.Profile, l *profile.Lock, kver, kpkgVersion string, debs map[string]string, kernelVermagic string, rep *Reporter) (string, string, error) {
	key := kmod.Key{Kernel: kver, Driver: p.GPU.Driver.Version, Flavor: p.GPU.Driver.Flavor}
	out := filepath.Join(cache, "kmod", key.String())
	if _, err := os.Stat(filepath.Join(out, kmod.Modules[0])); err != nil {
		if host := hostCodename(); host != "" && host != p.Base.Suite {
			return "", "", fmt.Errorf("NVIDIA modules for %s kernel %s must be compiled with %s's compiler, and this host runs %s; building in a %s chroot is not implemented yet: build this profile on a %s host",
				p.Base.Suite, kver, p.Base.Suite, host, p.Base.Suite, p.Base.Suite)
		}
		root := filepath.Join(kmodRoot, key.String())
		os.RemoveAll(root)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return "", "", err
		}
		defer os.RemoveAll(root)
		for _, lp := range l.Build {
			if err := run(ctx, "", "dpkg-deb", "-x", debs[lp.Name], root); err != nil {
				return "", "", err
			}
		}
		srcs, _ := filepath.Glob(filepath.Join(root, "usr/src", "nvidia-current*-"+p.GPU.Driver.Version))
		arch := filepath.Join(root, "usr/src", "linux-headers-"+kver)
		commons, _ := filepath.Glob(filepath.Join(root, "usr/src", "linux-headers-*-common"))
		if len(srcs) != 1 || len(commons) != 1 {
			return "", "", fmt.Errorf("the build inputs hold %d driver source trees and %d common header trees, want 1 each (re-lock)", len(srcs), len(commons))
		}
		rep.Logf("compiling NVIDIA %s %s modules for %s (minutes; cached afterwards in %s)", key.Driver, key.Flavor, kver, out)
		if err := kmod.Build(ctx, key, kpkgVersion, srcs[0], commons[0], arch, out); err != nil {
			os.RemoveAll(out)
			return "", "", err
		}
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

var codenameRE = regexp.MustCompile(`(?m)^VERSION_CODENAME=(\S+)$`)

func hostCodename() string {
	data, _ := os.ReadFile("/etc/os-release")
	if m := codenameRE.FindSubmatch(data); m != nil {
		return string(m[1])
	}
	return ""
}

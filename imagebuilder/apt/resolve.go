package apt

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/profile"
)

// NodePackages are installed in every image besides mmdebstrap's minbase set and the
// profile's own packages: what CONTRACTS §6 asks a node to run.
var NodePackages = []string{
	"systemd-sysv", "udev", "dbus", "kmod", "iproute2", "iptables", "ca-certificates",
	"systemd-timesyncd", "systemd-resolved", "containerd", "runc", "containernetworking-plugins", "nftables",
}

// minbase is what mmdebstrap --variant=minbase installs: Essential:yes, Priority:
// required, and apt (mmdebstrap(1), VARIANTS).
var minbase = []string{"?essential", "?priority(required)", "apt"}

// KernelImageRE matches a versioned kernel image package (not the metapackage).
var KernelImageRE = regexp.MustCompile(`^linux-image-[0-9]`)

// DriverPins returns apt preferences that hold the whole NVIDIA driver family at one
// version: the archive carries newer userspace (535.309.01 in bookworm-security) than
// kernel sources (535.261.03), and a mixed set fails at run time with "API mismatch".
func DriverPins(p *profile.Profile) string {
	if !p.HasDriver() {
		return ""
	}
	return fmt.Sprintf("Package: *nvidia* libcuda* libnvcuvid* libnvoptix* firmware-nvidia-*\nPin: version %s-*\nPin-Priority: 1001\n", p.GPU.Driver.Version)
}

// DKMSPackage is the driver's kernel-module source package for the profile's flavor.
func DKMSPackage(p *profile.Profile) string {
	if p.GPU.Driver.Flavor == "proprietary" {
		return "nvidia-kernel-dkms"
	}
	return "nvidia-open-kernel-dkms"
}

// ChrootTools are installed in the module build chroot besides minbase and the
// kernel headers, which pull in the compiler the kernel was built with (gcc-12 for
// bookworm, gcc-14 for trixie) through linux-compiler-gcc-*.
var ChrootTools = []string{"make", "libc6-dev", "binutils"}

// resolveBuild locks the build-only inputs of the NVIDIA modules: a build chroot of the
// profile's own suite (minbase, ChrootTools and linux-headers-KVER with everything they
// depend on) plus the driver's DKMS source package, which is unpacked into that chroot
// rather than installed (its maintainer scripts would run dkms).
func resolveBuild(ctx context.Context, e *Env, p *profile.Profile, kver string) ([]profile.LockedPackage, error) {
	chroot, err := e.Simulate(ctx, append(append(append([]string{}, minbase...), ChrootTools...), "linux-headers-"+kver))
	if err != nil {
		return nil, fmt.Errorf("module build chroot for kernel %s: %w", kver, err)
	}
	src, err := e.Simulate(ctx, []string{DKMSPackage(p) + "=" + p.GPU.Driver.Version + "-*"})
	if err != nil {
		return nil, fmt.Errorf("driver %s %s: %w", p.GPU.Driver.Version, p.GPU.Driver.Flavor, err)
	}
	for _, s := range src {
		if s.Name == DKMSPackage(p) {
			chroot = append(chroot, s)
		}
	}
	return e.Lock(ctx, dedupe(chroot))
}

// Resolve resolves p into a lock against the sources of e. e.Update must have run.
func Resolve(ctx context.Context, e *Env, p *profile.Profile) (*profile.Lock, error) {
	if len(p.ExtraDebs) > 0 {
		return nil, fmt.Errorf("profile %s: extraDebs (%s, …) are not supported by this gpuimage yet; remove them or lock by hand", p.Name, p.ExtraDebs[0].File)
	}
	want := append(append(append([]string{}, minbase...), NodePackages...), p.Packages...)
	if p.HasDriver() {
		// modprobe.d aliases that make `modprobe nvidia` find Debian's nvidia-current*.
		want = append(want, "nvidia-kernel-support")
	}
	inst, err := e.Simulate(ctx, want)
	if err != nil {
		return nil, err
	}
	kinst, err := e.Simulate(ctx, []string{p.Kernel.Package})
	if err != nil {
		return nil, fmt.Errorf("kernel.package %s: %w", p.Kernel.Package, err)
	}
	var kernel []Installed
	for _, k := range kinst {
		if KernelImageRE.MatchString(k.Name) {
			kernel = append(kernel, k)
		}
	}
	if len(kernel) != 1 {
		return nil, fmt.Errorf("kernel.package %s resolves to %d versioned linux-image packages (%v); name one kernel", p.Kernel.Package, len(kernel), kernel)
	}
	if p.Kernel.Version != "" && kernel[0].Name != "linux-image-"+p.Kernel.Version && !strings.HasPrefix(kernel[0].Name, "linux-image-"+p.Kernel.Version+"-") {
		return nil, fmt.Errorf("kernel.package %s installs %s, but kernel.version is %s; make them agree", p.Kernel.Package, kernel[0].Name, p.Kernel.Version)
	}
	inst = append(inst, kernel...)
	pkgs, err := e.Lock(ctx, dedupe(inst))
	if err != nil {
		return nil, err
	}
	var build []profile.LockedPackage
	if p.HasDriver() {
		kver := strings.TrimPrefix(kernel[0].Name, "linux-image-")
		if build, err = resolveBuild(ctx, e, p, kver); err != nil {
			return nil, err
		}
		if err := checkDriverFamily(p, append(append([]profile.LockedPackage{}, pkgs...), build...)); err != nil {
			return nil, err
		}
	}
	rel, err := e.Releases()
	if err != nil {
		return nil, err
	}
	return &profile.Lock{
		SchemaVersion: profile.LockSchemaVersion,
		Profile:       p.Name,
		ProfileDigest: p.Digest(),
		Release:       rel,
		Packages:      pkgs,
		Build:         build,
		ExtraDebs:     []profile.LockedExtraDeb{},
	}, nil
}

// driverFamily are the packages whose version must equal the driver's.
var driverFamily = regexp.MustCompile(`^(libnvidia-ml1|nvidia-smi|nvidia-alternative|firmware-nvidia-gsp|nvidia-kernel-support|nvidia(-open)?-kernel-dkms)$`)

func checkDriverFamily(p *profile.Profile, pkgs []profile.LockedPackage) error {
	var bad []string
	for _, lp := range pkgs {
		if driverFamily.MatchString(lp.Name) && !strings.HasPrefix(lp.Version, p.GPU.Driver.Version+"-") {
			bad = append(bad, lp.Name+" "+lp.Version)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("driver %s: the archive resolves %s at other versions; the whole driver family must match (is %s still in the archive?)", p.GPU.Driver.Version, strings.Join(bad, ", "), p.GPU.Driver.Version)
	}
	return nil
}

func dedupe(in []Installed) []Installed {
	seen := map[string]bool{}
	var out []Installed
	for _, i := range in {
		if !seen[i.Name+":"+i.Arch] {
			seen[i.Name+":"+i.Arch] = true
			out = append(out, i)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stale compares a lock with the profile digest and with what the archive (avail, from
// Env.Available) and the cache (cached reports whether a sha256 is in the .deb cache)
// can still provide. It returns one line per problem; none means the lock is fresh.
func Stale(l *profile.Lock, profileDigest string, avail map[string]profile.LockedPackage, cached func(sha string) bool) []string {
	var out []string
	if l.ProfileDigest != profileDigest {
		out = append(out, fmt.Sprintf("profileDigest: the profile changed since it was locked (lock %s, profile %s)", l.ProfileDigest, profileDigest))
	}
	for _, list := range [][]profile.LockedPackage{l.Packages, l.Build} {
		for _, lp := range list {
			a, ok := avail[lp.Name+"="+lp.Version]
			switch {
			case ok && a.SHA256 == lp.SHA256:
			case cached(lp.SHA256):
			case ok:
				out = append(out, fmt.Sprintf("%s %s: the archive's .deb has sha256 %s, the lock %s", lp.Name, lp.Version, a.SHA256, lp.SHA256))
			default:
				out = append(out, fmt.Sprintf("%s %s: no longer in the archive and not in the .deb cache", lp.Name, lp.Version))
			}
		}
	}
	return out
}

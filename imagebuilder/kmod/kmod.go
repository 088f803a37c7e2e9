// Package kmod builds the NVIDIA kernel modules of an image ahead of time from the
// driver's DKMS source package, against the image kernel's extracted headers (nothing is
// compiled on nodes and no compiler ships in the image), caches them by kernel × driver ×
// flavor, and checks their vermagic against the kernel. Errors name both versions when
// the driver and the kernel do not fit together.
package kmod

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/linewriter"
)

// Key identifies one module build.
type Key struct {
	Kernel string // uname -r of the image kernel, e.g. 6.1.0-50-amd64
	Driver string // 535.261.03
	Flavor string // open or proprietary
}

func (k Key) String() string { return k.Kernel + "_" + k.Driver + "_" + k.Flavor }

// Modules are the files a build produces, in Debian's names (nvidia-current*).
var Modules = []string{"nvidia-current.ko", "nvidia-current-modeset.ko", "nvidia-current-drm.ko", "nvidia-current-uvm.ko", "nvidia-current-peermem.ko"}

// upstream are the names the driver's Makefile writes.
var upstream = map[string]string{
	"nvidia.ko": "nvidia-current.ko", "nvidia-modeset.ko": "nvidia-current-modeset.ko",
	"nvidia-drm.ko": "nvidia-current-drm.ko", "nvidia-uvm.ko": "nvidia-current-uvm.ko",
	"nvidia-peermem.ko": "nvidia-current-peermem.ko",
}

// Vermagic is the kernel's module version magic as modinfo prints it, e.g.
// "6.1.0-50-amd64 SMP preempt mod_unload modversions".
func Vermagic(ko string) (string, error) {
	out, err := exec.Command("modinfo", "-F", "vermagic", ko).Output()
	if err != nil {
		return "", fmt.Errorf("modinfo %s: %v", ko, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// CheckVermagic returns an error unless every module's vermagic equals the kernel's
// (taken from a module of the kernel itself).
func CheckVermagic(kernelVermagic string, modules map[string]string) error {
	var bad []string
	for name, vm := range modules {
		if vm != kernelVermagic {
			bad = append(bad, fmt.Sprintf("%s has %q", name, vm))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("vermagic mismatch: the image kernel has %q but %s; the modules were built against other headers: rebuild them (delete the kmod cache entry)", kernelVermagic, strings.Join(bad, ", "))
	}
	return nil
}

var compileErrRE = regexp.MustCompile(`(?m)^(\S+\.c):(\d+):\d+: error: (.*)$`)

// Incompatibility explains a failed module build: the first compiler error, with the
// driver and kernel versions, since that is almost always an API change in the kernel.
func Incompatibility(k Key, kernelPkgVersion string, log string) error {
	if m := compileErrRE.FindStringSubmatch(log); m != nil {
		return fmt.Errorf("NVIDIA driver %s (%s) does not build against kernel %s (%s): %s:%s: %s; pin a kernel ABI this driver supports in the profile's kernel.package, or pick another driver version or flavor",
			k.Driver, k.Flavor, k.Kernel, kernelPkgVersion, m[1], m[2], m[3])
	}
	return fmt.Errorf("NVIDIA driver %s (%s) failed to build against kernel %s (%s):\n%s", k.Driver, k.Flavor, k.Kernel, kernelPkgVersion, linewriter.Tail(log, 30))
}

// Build compiles the modules of src (the DKMS source tree, a path inside root) in the
// build chroot root against the image kernel's headers, which are installed there at
// /usr/src/linux-headers-KVER, and writes them, stripped of debug information, to out
// (outside root), unless out already holds them. The compiler is the chroot's, the one
// of the profile's own suite, never the host's. env is the build environment
// (SOURCE_DATE_EPOCH and the like). progress, if set, is called with the number of
// objects compiled so far as kbuild reports each one.
func Build(ctx context.Context, k Key, kernelPkgVersion, root, src, out string, env []string, progress func(objects int)) error {
	if haveAll(out) {
		return nil
	}
	arch := "/usr/src/linux-headers-" + k.Kernel
	mk, err := os.ReadFile(filepath.Join(root, arch, "Makefile"))
	if err != nil {
		return fmt.Errorf("kernel headers for %s are not in the build chroot: %v", k.Kernel, err)
	}
	common := CommonTree(mk, arch)
	if err := devNodes(root); err != nil {
		return err
	}
	var log bytes.Buffer
	w := objectCounter(&log, progress)
	chroot := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, args...)...)
		cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "HOME=/root"}, env...)
		cmd.Stdout, cmd.Stderr = w, w
		return cmd.Run()
	}
	if err := chroot("make", "-C", src, fmt.Sprintf("-j%d", runtime.NumCPU()), "modules", "SYSSRC="+common, "SYSOUT="+arch); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return Incompatibility(k, kernelPkgVersion, log.String())
	}
	built := map[string]string{}
	filepath.WalkDir(filepath.Join(root, src), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".ko") {
			name := filepath.Base(path)
			if deb, ok := upstream[name]; ok {
				name = deb
			}
			built[name] = strings.TrimPrefix(path, root)
		}
		return nil
	})
	stripped := filepath.Join(src, ".gpurack-stripped")
	if err := os.MkdirAll(filepath.Join(root, stripped), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, m := range Modules {
		from, ok := built[m]
		if !ok {
			if m == "nvidia-current-peermem.ko" {
				continue // built only with the Mellanox peer-memory headers present
			}
			return fmt.Errorf("NVIDIA driver %s (%s): the build produced no %s (it produced %d modules)", k.Driver, k.Flavor, m, len(built))
		}
		if err := chroot("strip", "--strip-debug", "-o", filepath.Join(stripped, m), from); err != nil {
			return fmt.Errorf("strip %s: %v\n%s", from, err, linewriter.Tail(log.String(), 5))
		}
		data, err := os.ReadFile(filepath.Join(root, stripped, m))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, m), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// includeRE finds the common header tree that Debian's per-flavour headers include.
var includeRE = regexp.MustCompile(`(?m)^include (/usr/src/linux-headers-[^/\s]+)/Makefile`)

// CommonTree returns the common header tree that the per-flavour headers' Makefile
// (at arch) includes, the driver's SYSSRC; arch itself when it includes none.
func CommonTree(makefile []byte, arch string) string {
	if m := includeRE.FindSubmatch(makefile); m != nil {
		return string(m[1])
	}
	return arch
}

// devNodes makes sure the chroot has the character devices kbuild and gcc open.
func devNodes(root string) error {
	for _, d := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"urandom", 1, 9}} {
		path := filepath.Join(root, "dev", d.name)
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			continue
		}
		os.Remove(path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("build chroot: mknod /dev/%s: %v (module builds need root)", d.name, err)
		}
	}
	return nil
}

func haveAll(out string) bool {
	for _, m := range Modules[:4] {
		if _, err := os.Stat(filepath.Join(out, m)); err != nil {
			return false
		}
	}
	return true
}

// objectCounter keeps the build's output in buf and calls fn, if set, with the number
// of "CC" lines so far.
func objectCounter(buf *bytes.Buffer, fn func(objects int)) *linewriter.Writer {
	n := 0
	return &linewriter.Writer{Buf: buf, Line: func(line string) {
		// kbuild prints "CC [M]  obj"; the open flavor's core (src/nvidia) is built
		// by its own Makefile first, which prints "CC  obj".
		if strings.HasPrefix(strings.TrimSpace(line), "CC ") {
			n++
			if fn != nil {
				fn(n)
			}
		}
	}}
}

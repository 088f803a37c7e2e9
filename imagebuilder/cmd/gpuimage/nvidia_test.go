package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestNvidiaImages builds the NVIDIA profiles (minutes each: the kernel modules compile
// from the DKMS source) and checks the driver end to end in the image: vermagic against
// the kernel, `modprobe --show-depends nvidia` through Debian's aliases, and the driver
// version in `gpuimage inspect`. It runs under GPURACK_E2E_SLOW=1 (make e2e-slow), and
// there it fails rather than skips when it cannot build: a machine without the tools or
// an archive that does not lock the profiles must not pass as a green e2e-slow run.
func TestNvidiaImages(t *testing.T) {
	testreq.OptIn(t, "GPURACK_E2E_SLOW", "the NVIDIA images take many minutes each (make e2e-slow)")
	k8s := buildtest.NeedImageTools(t, "qemu-system-x86_64")
	root := repoRoot(t)
	cache := build.DefaultCacheDir()
	for _, name := range []string{"debian12-nvidia535", "debian13-nvidia550"} {
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			src, err := os.ReadFile(filepath.Join(root, "profiles", name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			prof := filepath.Join(tmp, name+".yaml")
			os.WriteFile(prof, src, 0o644)
			if out, errOut, code := runGPUImage("lock", prof, "--cache", cache); code != 0 {
				t.Fatalf("%s does not lock against the live archive, so nothing was built: %s%s", name, out, lastLines(errOut, 3))
			}
			priv, pub := filepath.Join(tmp, "key.pem"), filepath.Join(tmp, "key.pub.pem")
			mustRun(t, "keygen", priv, pub)
			start := time.Now()
			out, errOut, code := runGPUImage("build", prof, "--out", filepath.Join(tmp, "store"), "--cache", cache, "--key", priv, "--src", root, "--agent-unit", filepath.Join(root, "agent", "systemd", "gpuagent.service"), "--k8s-dir", k8s)
			if code != 0 {
				t.Fatalf("build: exit %d\n%s", code, lastLines(out+errOut, 40))
			}
			t.Logf("build took %s:\n%s", time.Since(start).Round(time.Second), lastLines(out+errOut, 20))
			dir := builtDir(t, out)
			mustRun(t, "verify", dir, "--pubkey", pub)
			ins := mustRun(t, "inspect", dir)
			t.Log(lastLines(ins, 45))
			if !strings.Contains(ins, "driver      NVIDIA ") {
				t.Errorf("inspect reports no driver:\n%s", ins)
			}
			// modprobe resolves "nvidia" through the driver alternative's modprobe.d entry.
			x := filepath.Join(tmp, "x")
			if out, err := exec.Command("unsquashfs", "-q", "-d", x, filepath.Join(dir, "rootfs.squashfs")).CombinedOutput(); err != nil {
				t.Fatalf("unsquashfs: %v\n%s", err, out)
			}
			kvers, _ := filepath.Glob(filepath.Join(x, "usr/lib/modules/*"))
			if len(kvers) != 1 {
				t.Fatalf("want one kernel in the image, got %v", kvers)
			}
			kver := filepath.Base(kvers[0])
			dep, err := exec.Command("chroot", x, "modprobe", "-S", kver, "--show-depends", "nvidia-uvm").CombinedOutput()
			t.Logf("modprobe --show-depends nvidia-uvm (in the image):\n%s", dep)
			if err != nil || !strings.Contains(string(dep), "nvidia-current-uvm") {
				t.Errorf("modprobe nvidia-uvm does not resolve to nvidia-current-uvm in the image: %v", err)
			}
			for _, m := range []string{"nvidia-current", "nvidia-current-uvm"} {
				dep, err := exec.Command("chroot", x, "modprobe", "-S", kver, "--show-depends", m).CombinedOutput()
				if err != nil || !strings.Contains(string(dep), "updates/dkms/"+m+".ko") {
					t.Errorf("modprobe %s: %v\n%s", m, err, dep)
				}
			}
			vm, _ := exec.Command("modinfo", "-F", "vermagic", filepath.Join(kvers[0], "updates/dkms/nvidia-current.ko")).Output()
			t.Logf("modinfo vermagic nvidia-current.ko: %s (kernel %s)", strings.TrimSpace(string(vm)), kver)
			if !strings.HasPrefix(string(vm), kver+" ") {
				t.Errorf("vermagic %q does not match kernel %s", vm, kver)
			}
			if fw, _ := filepath.Glob(filepath.Join(x, "usr/lib/firmware/nvidia/*/gsp*.bin")); len(fw) == 0 {
				t.Error("no GSP firmware in the image")
			}
		})
	}
}

package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/imagebuilder/assemble"
	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/buildtest"
	"github.com/gpurack/gpurack/internal/buildinfo"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := runGPUImage(args...)
	if code != 0 {
		t.Fatalf("gpuimage %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out + errOut
}

// TestTinyImage is the tiny profile end to end: lock against the live archive (the
// committed lock rots as the mirror drops versions), build twice as two different
// builders would and compare every byte, verify, inspect, boot it in QEMU with the
// rootfs over HTTP, and refuse a tampered rootfs in gpurack-init and in gpuimage verify.
func TestTinyImage(t *testing.T) {
	k8s := buildtest.RequireImageTools(t, "qemu-system-x86_64")
	root := repoRoot(t)
	tmp := t.TempDir()
	cache := build.DefaultCacheDir() // shared: the .deb cache and apt lists stay warm between runs

	// Lock into a temporary directory.
	tiny, err := os.ReadFile(filepath.Join(root, "profiles", "tiny.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	prof := filepath.Join(tmp, "tiny.yaml")
	os.WriteFile(prof, tiny, 0o644)
	t.Log(mustRun(t, "lock", prof, "--cache", cache))
	t.Log(mustRun(t, "lock", "--check", prof, "--cache", cache))

	priv, pub := filepath.Join(tmp, "key.pem"), filepath.Join(tmp, "key.pub.pem")
	mustRun(t, "keygen", priv, pub)

	// One gpuagent for both builds: others edit agent/ while this runs, and the
	// reproducibility check is about gpuimage, not about a moving source tree.
	agent := filepath.Join(tmp, "gpuagent")
	if err := build.GoBuild(context.Background(), root, "./agent/cmd/gpuagent", agent, true, buildinfo.String()); err != nil {
		t.Fatal(err)
	}
	agentUnit := filepath.Join(root, "agent", "systemd", "gpuagent.service")
	common := []string{"--key", priv, "--src", root, "--agent-bin", agent, "--agent-unit", agentUnit, "--k8s-dir", k8s}

	start := time.Now()
	out1 := mustRun(t, append([]string{"build", prof, "--out", filepath.Join(tmp, "store1"), "--cache", cache}, common...)...)
	t.Logf("build 1 took %s:\n%s", time.Since(start).Round(time.Second), lastLines(out1, 20))
	dir1 := builtDir(t, out1)

	// Build 2 is another builder: its own cache directory (given the .debs through
	// gpuimage cache export/import, as a host without the archive would be), its own
	// process, working directory and time zone, and umask 077, which once made /etc
	// 0700 in the image.
	cache2 := filepath.Join(tmp, "cache2")
	debs := filepath.Join(tmp, "debs.tar")
	mustRun(t, "cache", "export", debs, profile.LockPath(prof), "--cache", cache)
	mustRun(t, "cache", "import", debs, "--cache", cache2)

	// A corrupted cache entry is detected and fetched again, never used.
	l, err := profile.LoadLock(profile.LockPath(prof))
	if err != nil {
		t.Fatal(err)
	}
	victim := l.Find("netbase")
	c := filepath.Join(cache2, "debs", "sha256", victim.SHA256[:2], victim.SHA256+".deb")
	if err := os.WriteFile(c, []byte("not a deb"), 0o644); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	out2 := runAsOtherBuilder(t, filepath.Join(tmp, "elsewhere"), append([]string{"build", prof, "--out", filepath.Join(tmp, "store2"), "--cache", cache2}, common...)...)
	t.Logf("build 2 (umask 077, TZ=%s, own cache) took %s:\n%s", otherTZ, time.Since(start).Round(time.Second), lastLines(out2, 20))
	dir2 := builtDir(t, out2)
	if !strings.Contains(out2, "netbase") || !strings.Contains(out2, "removing it and fetching again") {
		t.Errorf("build 2 did not report refetching the corrupted cache entry of netbase:\n%s", out2)
	}

	artifacts := []string{"vmlinuz", "initrd.img", "rootfs.squashfs", "cmdline", "manifest.json", "manifest.sig", "sbom.spdx.json"}
	t.Run("reproducible", func(t *testing.T) {
		if filepath.Base(dir1) != filepath.Base(dir2) {
			t.Errorf("image ids differ: %s vs %s", filepath.Base(dir1), filepath.Base(dir2))
		}
		for _, name := range artifacts {
			a, b := sha256File(t, filepath.Join(dir1, name)), sha256File(t, filepath.Join(dir2, name))
			if a != b {
				t.Errorf("%s differs between two builds: %s vs %s", name, a, b)
			} else {
				t.Logf("%-16s sha256:%s identical", name, a)
			}
		}
		// The store's files are the same for every builder too: gpuboot, under
		// another user, must be able to read them.
		for _, dir := range []string{dir1, dir2} {
			if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o755 {
				t.Errorf("%s: mode %v, %v; want 0755", dir, st.Mode(), err)
			}
			for _, name := range artifacts {
				if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode().Perm() != 0o644 {
					t.Errorf("%s: mode %v, %v; want 0644", filepath.Join(dir, name), st.Mode(), err)
				}
			}
		}
		// Byte-identical could still be identically wrong: the modes the umask once
		// changed, read from the image itself.
		list, err := exec.Command("unsquashfs", "-lln", filepath.Join(dir2, "rootfs.squashfs")).Output()
		if err != nil {
			t.Fatalf("unsquashfs -lln: %v", err)
		}
		modes := map[string]string{}
		for _, line := range strings.Split(string(list), "\n") {
			line, _, _ = strings.Cut(line, " -> ") // a symbolic link: "path -> target"
			if f := strings.Fields(line); len(f) >= 6 {
				modes[strings.TrimPrefix(f[len(f)-1], "squashfs-root")] = f[0]
			}
		}
		for path, want := range map[string]string{"": "drwxr-xr-x", "/etc": "drwxr-xr-x", "/etc/gpurack": "drwxr-xr-x", "/etc/gpurack/image-id": "-rw-r--r--",
			"/etc/systemd/system/gpuagent.service": "-rw-r--r--", "/usr/bin/gpuagent": "-rwxr-xr-x", "/usr/lib/gpurack": "drwxr-xr-x"} {
			if modes[path] != want {
				t.Errorf("/%s in the image built under umask 077: mode %q, want %s", strings.TrimPrefix(path, "/"), modes[path], want)
			}
		}
	})

	t.Run("verify and inspect", func(t *testing.T) {
		t.Log(mustRun(t, "verify", dir1, "--pubkey", pub))
		out := mustRun(t, "inspect", dir1)
		for _, want := range []string{"kernel      6.", "driver      none", "kubernetes  v1.34.2", "packages    ", "systemd", "files       ", "/usr/bin/kubelet"} {
			if !strings.Contains(out, want) {
				t.Errorf("inspect lacks %q:\n%s", want, out)
			}
		}
		t.Log(lastLines(out, 40))
	})

	t.Run("boots over HTTP", func(t *testing.T) {
		srv := httptest.NewServer(http.FileServer(http.Dir(dir1)))
		defer srv.Close()
		port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
		cmdline, _ := os.ReadFile(filepath.Join(dir1, "cmdline"))
		id := filepath.Base(dir1)
		args := strings.TrimSpace(string(cmdline)) + " gpurack.rootfs=http://10.0.2.2:" + port + "/rootfs.squashfs BOOTIF=01-52-54-00-12-34-56 gpurack.onfail=poweroff"
		want := `gpurack: booted image ` + id + ` root=overlay lower=squashfs multi-user.target=active containerd.service=active \S+ gpuagent.service=active`
		log := bootQEMU(t, filepath.Join(dir1, "vmlinuz"), filepath.Join(dir1, "initrd.img"), args, regexp.MustCompile(want), nil)
		for _, want := range []string{"DHCP lease 10.0.2.15/24", "rootfs sha256 ", " verified", "switch_root: exec /sbin/init", "gpurack-images.service=active", "cgroup=cgroup2fs"} {
			if !strings.Contains(log, want) {
				t.Errorf("serial console lacks %q", want)
			}
		}
	})

	t.Run("tampered rootfs", func(t *testing.T) {
		bad := filepath.Join(tmp, "tampered", filepath.Base(dir1))
		os.MkdirAll(bad, 0o755)
		for _, name := range artifacts {
			data, err := os.ReadFile(filepath.Join(dir1, name))
			if err != nil {
				t.Fatal(err)
			}
			if name == "rootfs.squashfs" {
				data[len(data)/2] ^= 0x01
			}
			os.WriteFile(filepath.Join(bad, name), data, 0o644)
		}
		out, errOut, code := runGPUImage("verify", bad, "--pubkey", pub)
		if code == 0 || !strings.Contains(errOut, "FAIL rootfs.squashfs") {
			t.Errorf("verify of a tampered image: exit %d\n%s%s", code, out, errOut)
		}
		for _, ok := range []string{"vmlinuz", "initrd.img", "manifest.json"} {
			if strings.Contains(errOut, "FAIL "+ok) {
				t.Errorf("verify blamed the intact %s:\n%s", ok, errOut)
			}
		}
		t.Log(errOut)
		// Packed into the initramfs (the single-file boot): gpurack-init must refuse it.
		packed := filepath.Join(tmp, "packed.img")
		f, err := os.Create(packed)
		if err != nil {
			t.Fatal(err)
		}
		initrd, err := os.Open(filepath.Join(dir1, "initrd.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer initrd.Close()
		if err := assemble.AppendPacked(f, initrd, filepath.Join(bad, "rootfs.squashfs")); err != nil {
			t.Fatal(err)
		}
		f.Close()
		cmdline, _ := os.ReadFile(filepath.Join(dir1, "cmdline"))
		log := bootQEMU(t, filepath.Join(dir1, "vmlinuz"), packed, strings.TrimSpace(string(cmdline))+" gpurack.onfail=poweroff",
			regexp.MustCompile(`rootfs digest mismatch: refusing to boot`), regexp.MustCompile(`powering off`))
		if strings.Contains(log, "switch_root: exec") {
			t.Error("gpurack-init switched to a tampered rootfs")
		}
		if !strings.Contains(log, "what to do: ") || !strings.Contains(log, "gpuimage verify") {
			t.Error("the refusal does not tell the operator what to do")
		}
	})
}

// otherTZ is far from UTC and from the usual builder's zone.
const otherTZ = "Pacific/Kiritimati"

// runAsOtherBuilder runs gpuimage (this test binary, see TestMain) in its own process
// under umask 077, TZ=otherTZ and the working directory dir, and returns its stdout and
// stderr; it fails t unless gpuimage exits 0.
func runAsOtherBuilder(t *testing.T, dir string, args ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", append([]string{"-c", `umask 077 && exec "$0" "$@"`, self}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), runAsGPUImage+"=1", "TZ="+otherTZ)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpuimage %s (umask 077, TZ=%s, in %s): %v\n%s", strings.Join(args, " "), otherTZ, dir, err, out)
	}
	return string(out)
}

var builtRE = regexp.MustCompile(`(?m)^built (\S+)$`)

func builtDir(t *testing.T, out string) string {
	m := builtRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no 'built DIR' line in:\n%s", out)
	}
	return m[1]
}

func sha256File(t *testing.T, path string) string {
	d, err := manifest.DigestFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return d.SHA256
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// bootQEMU boots kernel+initrd under TCG and returns the serial console once want
// matches; with then set it also waits for then. It fails the test after 12 minutes
// (a generous guard for a loaded 2-core host, not a performance assertion).
func bootQEMU(t *testing.T, kernel, initrd, cmdline string, want, then *regexp.Regexp) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-m", "2048", "-smp", "2",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", cmdline,
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56",
		"-device", "virtio-rng-pci")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	logPath := filepath.Join(t.TempDir(), "serial.log")
	logFile, _ := os.Create(logPath)
	defer logFile.Close()
	var log strings.Builder
	start := time.Now()
	sc := bufio.NewScanner(io.TeeReader(stdout, logFile))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	matched := false
	for sc.Scan() {
		line := sc.Text()
		log.WriteString(line + "\n")
		if strings.Contains(line, "gpurack") {
			t.Logf("%6.1fs %s", time.Since(start).Seconds(), strings.TrimSpace(line))
		}
		if !matched && want.MatchString(line) {
			matched = true
			if then == nil {
				return log.String()
			}
		}
		if matched && then.MatchString(line) {
			return log.String()
		}
	}
	t.Fatalf("the serial console never showed %q (QEMU: %v); last lines:\n%s", want, ctx.Err(), lastLines(log.String(), 60))
	return ""
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestBadInputs: each bad input gets an error that names it and says what to do.
func TestBadInputs(t *testing.T) {
	root := repoRoot(t)
	tiny, err := os.ReadFile(filepath.Join(root, "profiles", "tiny.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.ReadFile(filepath.Join(root, "profiles", "tiny.lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	cache := build.DefaultCacheDir()
	write := func(t *testing.T, name, content string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	expectFail := func(t *testing.T, wants []string, args ...string) {
		t.Helper()
		out, errOut, code := runGPUImage(args...)
		if code == 0 {
			t.Fatalf("gpuimage %s succeeded:\n%s", strings.Join(args, " "), out)
		}
		for _, w := range wants {
			if !strings.Contains(errOut, w) {
				t.Errorf("gpuimage %s: error lacks %q:\n%s", strings.Join(args, " "), w, errOut)
			}
		}
		t.Logf("gpuimage %s:\n%s", strings.Join(args, " "), lastLines(errOut, 6))
	}

	t.Run("bad profile", func(t *testing.T) {
		p := write(t, "tiny.yaml", string(tiny)+"surprise: 1\n")
		expectFail(t, []string{"tiny.yaml:", `unknown field "surprise"`}, "build", p, "--out", t.TempDir())
		expectFail(t, []string{"tiny.yaml:", `unknown field "surprise"`}, "lock", p)
	})
	t.Run("stale lock", func(t *testing.T) {
		p := write(t, "tiny.yaml", strings.Replace(string(tiny), "  - kmod\n", "  - kmod\n  - jq\n", 1))
		os.WriteFile(profile.LockPath(p), lock, 0o644)
		expectFail(t, []string{"tiny.lock.json is stale", "the profile changed", "run gpuimage lock " + p}, "build", p, "--out", t.TempDir())
	})
	t.Run("no lock", func(t *testing.T) {
		p := write(t, "tiny.yaml", string(tiny))
		expectFail(t, []string{"has no lock file", "run gpuimage lock"}, "build", p, "--out", t.TempDir())
	})

	t.Run("no agent unit", func(t *testing.T) {
		p := write(t, "tiny.yaml", string(tiny))
		os.WriteFile(profile.LockPath(p), lock, 0o644)
		expectFail(t, []string{"no gpuagent unit given", "pass --agent-unit", "agent/systemd/gpuagent.service"}, "build", p, "--out", t.TempDir(), "--cache", t.TempDir())
		missing := filepath.Join(t.TempDir(), "gpuagent.service")
		expectFail(t, []string{"--agent-unit " + missing + " does not exist", "agent/systemd/gpuagent.service"}, "build", p, "--out", t.TempDir(), "--cache", t.TempDir(), "--agent-unit", missing)
		expectFail(t, []string{"is not a regular file"}, "build", p, "--out", t.TempDir(), "--cache", t.TempDir(), "--agent-unit", t.TempDir())
	})

	testreq.Tool(t, "apt-get", "run the archive cases on Debian (apt)")
	if _, err := build.Sources(&profile.Profile{Base: profile.Base{Suite: "bookworm"}}); err != nil {
		testreq.Missing(t, fmt.Sprintf("the archive cases have no Debian source (%v)", err), "configure a Debian apt source on this machine")
	}
	t.Run("unreachable mirror", func(t *testing.T) {
		p := write(t, "tiny.yaml", strings.Replace(string(tiny), "  # mirror: leave out to use the host's configured Debian source\n", "  mirror: http://127.0.0.1:1/debian\n", 1))
		expectFail(t, []string{"apt update from http://127.0.0.1:1/debian", "check that the archive is reachable"}, "lock", p, "--cache", t.TempDir())
	})
	t.Run("missing package", func(t *testing.T) {
		p := write(t, "tiny.yaml", strings.Replace(string(tiny), "  - kmod\n", "  - kmod\n  - gpurack-no-such-package\n", 1))
		expectFail(t, []string{"gpurack-no-such-package", "Unable to locate package"}, "lock", p, "--cache", cache)
	})
	t.Run("locked version gone from the archive", func(t *testing.T) {
		l, err := profile.ParseLock("tiny.lock.json", lock)
		if err != nil {
			t.Fatal(err)
		}
		nb := l.Find("netbase")
		nb.Version, nb.SHA256 = nb.Version+"+gpurack.gone", strings.Repeat("0", 64)
		data, _ := l.Marshal()
		p := write(t, "tiny.yaml", string(tiny))
		os.WriteFile(profile.LockPath(p), data, 0o644)
		expectFail(t, []string{"is stale", "netbase " + nb.Version + ": no longer in the archive and not in the .deb cache"}, "lock", "--check", p, "--cache", cache)
	})
}

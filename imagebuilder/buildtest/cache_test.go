package buildtest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestKeyCoversEachInput(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("one"), 0o644)
	key := func(profile, lock string) string {
		k := NewKey("test/v1")
		k.Bytes("profile", []byte(profile))
		k.Bytes("lock", []byte(lock))
		if err := k.Dir("dir", dir); err != nil {
			t.Fatal(err)
		}
		return k.Sum()
	}
	base := key("p", "l")
	if key("p", "l") != base {
		t.Fatal("the same inputs gave two keys")
	}
	// Bytes moved from one input to the next must change the key.
	if key("pl", "") == base || key("", "pl") == base {
		t.Error("moving bytes between inputs kept the key")
	}
	os.WriteFile(filepath.Join(dir, "a"), []byte("two"), 0o644)
	if key("p", "l") == base {
		t.Error("a changed file under Dir kept the key")
	}
	os.WriteFile(filepath.Join(dir, "b"), nil, 0o644)
	withB := key("p", "l")
	os.Remove(filepath.Join(dir, "b"))
	if key("p", "l") == withB {
		t.Error("removing an empty file under Dir kept the key")
	}
}

func TestKeyFollowsGoSources(t *testing.T) {
	root := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.24\n")
	write("go.sum", "")
	write("cmd/a/main.go", "package main\n\nimport _ \"example.com/m/lib\"\n\nfunc main() {}\n")
	write("lib/lib.go", "package lib\n")
	write("other/other.go", "package other\n")
	key := func() string {
		k := NewKey("test/v1")
		if err := k.GoSources(root, "./cmd/a"); err != nil {
			t.Fatal(err)
		}
		return k.Sum()
	}
	base := key()
	write("other/other.go", "package other\n\nvar X = 1\n")
	if key() != base {
		t.Error("a package cmd/a does not import changed the key")
	}
	write("lib/lib.go", "package lib\n\nvar X = 1\n")
	if key() == base {
		t.Error("a change in a package cmd/a imports kept the key")
	}
}

func TestImageCacheBuildsOnceAndPrunes(t *testing.T) {
	c := &ImageCache{Dir: t.TempDir(), Keep: 2}
	builds := 0
	get := func(name string) (string, bool) {
		k := NewKey("test/v1")
		k.Bytes("name", []byte(name))
		return c.Get(t, k, func(dir string) {
			builds++
			os.WriteFile(filepath.Join(dir, "image"), []byte(name), 0o644)
		})
	}
	a, hit := get("a")
	if hit || builds != 1 {
		t.Fatalf("first get: hit %v, builds %d", hit, builds)
	}
	if b, _ := os.ReadFile(filepath.Join(a, "image")); string(b) != "a" {
		t.Fatalf("entry holds %q", b)
	}
	a2, hit := get("a")
	if !hit || a2 != a || builds != 1 {
		t.Fatalf("second get: hit %v, dir %s (first %s), builds %d", hit, a2, a, builds)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(a, old, old)
	get("b")
	time.Sleep(10 * time.Millisecond)
	get("c") // three entries, Keep 2: a, least recently used, goes
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Errorf("the least recently used entry is still there (%v)", err)
	}
	ents, _ := os.ReadDir(c.Dir)
	if len(ents) != 2 {
		t.Errorf("%d entries after pruning, want 2", len(ents))
	}
}

func TestImageCacheTwoBuildersOneKey(t *testing.T) {
	c := &ImageCache{Dir: t.TempDir()}
	var wg sync.WaitGroup
	dirs := make([]string, 2)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := NewKey("test/v1")
			k.Bytes("name", []byte("same"))
			// Each runs in its own subtest: Get may fail its t.
			t.Run("builder", func(t *testing.T) {
				dirs[i], _ = c.Get(t, k, func(dir string) {
					time.Sleep(50 * time.Millisecond)
					os.WriteFile(filepath.Join(dir, "image"), []byte("x"), 0o644)
				})
			})
		}()
	}
	wg.Wait()
	if dirs[0] == "" || dirs[0] != dirs[1] {
		t.Fatalf("two builders of one key got %q and %q", dirs[0], dirs[1])
	}
	if _, err := os.Stat(filepath.Join(dirs[0], completeMark)); err != nil {
		t.Fatalf("the entry is not complete: %v", err)
	}
	ents, _ := os.ReadDir(c.Dir)
	if len(ents) != 1 {
		t.Errorf("%d directories in the cache, want 1 (no leftover temporary)", len(ents))
	}
}

// stoppingTB is a testing.TB whose Fatal stops the caller as t.Fatal does (here by a
// panic the test recovers) and whose cleanups the test runs: a build that fails its
// test half way, seen from outside.
type stoppingTB struct {
	testing.TB
	failed   bool
	cleanups []func()
}

type stopped struct{}

func (s *stoppingTB) Cleanup(f func())           { s.cleanups = append(s.cleanups, f) }
func (s *stoppingTB) Failed() bool               { return s.failed }
func (s *stoppingTB) FailNow()                   { s.failed = true; panic(stopped{}) }
func (s *stoppingTB) Fatal(args ...any)          { s.FailNow() }
func (s *stoppingTB) Fatalf(string, ...any)      { s.FailNow() }
func (s *stoppingTB) Helper()                    {}
func (s *stoppingTB) Logf(f string, args ...any) { s.TB.Logf(f, args...) }

func TestImageCacheStoppedBuildStoresNothing(t *testing.T) {
	c := &ImageCache{Dir: t.TempDir()}
	k := NewKey("test/v1")
	tb := &stoppingTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != (stopped{}) {
				panic(r)
			}
		}()
		c.Get(tb, k, func(dir string) {
			os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644)
			tb.Fatalf("the build gave up")
		})
		t.Error("Get returned after its build stopped the test")
	}()
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	if _, err := os.Stat(filepath.Join(c.Dir, k.Sum())); !os.IsNotExist(err) {
		t.Errorf("a build that stopped left an entry (%v)", err)
	}
	if ents, _ := os.ReadDir(c.Dir); len(ents) != 0 {
		t.Errorf("a build that stopped left %d directories", len(ents))
	}
}

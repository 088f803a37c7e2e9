package buildtest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/imagebuilder/build"
)

// Key is the content address of a built image: a SHA-256 over everything the build
// reads, each input under its own label so that moving bytes from one input to another
// changes the key. Build it with the methods below, then Sum.
type Key struct {
	h      hash.Hash
	inputs int // how many inputs, for the log
}

// NewKey starts a key for a build recipe named kind (a version of the recipe: bump it
// when what the recipe does changes in a way its inputs do not show).
func NewKey(kind string) *Key {
	k := &Key{h: sha256.New()}
	k.Bytes("recipe", []byte(kind))
	return k
}

// Bytes adds b under label.
func (k *Key) Bytes(label string, b []byte) {
	fmt.Fprintf(k.h, "%s\x00%d\x00", label, len(b))
	k.h.Write(b)
	k.inputs++
}

// File adds the content of the file at path under label.
func (k *Key) File(label, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("cache key: %w", err)
	}
	k.Bytes(label, b)
	return nil
}

// Dir adds every regular file under dir (names relative to dir, and contents), in
// lexical order, under label. Symbolic links add their target.
func (k *Key) Dir(label, dir string) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cache key: %w", err)
	}
	slices.Sort(names)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("cache key: %w", err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("cache key: %w", err)
			}
			k.Bytes(label+"/"+rel+" ->", []byte(target))
			continue
		}
		if err := k.File(label+"/"+rel, p); err != nil {
			return err
		}
	}
	return nil
}

// GoSources adds the Go sources the packages pkgs (of the module at root) are built
// from: for each dependency in the module, the content of its Go, cgo and embedded
// files; for each other module's package, its module path and version; and root's
// go.mod and go.sum. A change to any source an image's binaries are built from changes
// the key; a change elsewhere in the tree does not.
func (k *Key) GoSources(root string, pkgs ...string) error {
	args := append([]string{"list", "-deps", "-f",
		`{{if not .Standard}}{{.ImportPath}}|{{.Dir}}|{{if .Module}}{{.Module.Path}}@{{.Module.Version}}|{{.Module.Main}}{{end}}|{{join .GoFiles ","}},{{join .CgoFiles ","}},{{join .EmbedFiles ","}},{{join .HFiles ","}},{{join .CFiles ","}}{{end}}`},
		pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("cache key: go list %s: %v\n%s", strings.Join(pkgs, " "), err, stderr.String())
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := k.File(f, filepath.Join(root, f)); err != nil {
			return err
		}
	}
	k.Bytes("go", []byte(goVersion(root)))
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		f := strings.SplitN(line, "|", 5)
		if len(f) != 5 {
			return fmt.Errorf("cache key: go list printed %q", line)
		}
		importPath, dir, mod, main, files := f[0], f[1], f[2], f[3], f[4]
		if main != "true" {
			k.Bytes("package "+importPath, []byte(mod))
			continue
		}
		for _, name := range strings.Split(files, ",") {
			if name == "" {
				continue
			}
			if err := k.File("package "+importPath+"/"+name, filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// goVersion is `go version` as run in root (the toolchain that builds the binaries).
func goVersion(root string) string {
	cmd := exec.Command("go", "version")
	cmd.Dir = root
	out, _ := cmd.Output()
	return strings.TrimSpace(string(out))
}

// Sum is the key: hex SHA-256, 64 characters.
func (k *Key) Sum() string { return hex.EncodeToString(k.h.Sum(nil)) }

// ImageCache keeps built images by their Key, so that the tests that boot an image
// build it once per change of its inputs, not once per test binary or CI run. Entries
// are directories, written whole into a temporary directory beside the cache and
// renamed into place, so a reader sees a complete entry or none, and two builders of
// one key (two packages' tests at once) keep whichever finished first.
type ImageCache struct {
	// Dir holds one directory per key.
	Dir string
	// Keep is how many entries stay after a new one is stored (the most recently
	// used); 0 keeps them all.
	Keep int
}

// DefaultImageCache is the cache under gpuimage's own cache directory
// ($GPURACK_CACHE/imagebuilder/test-images), keeping the 4 most recently used images.
func DefaultImageCache() *ImageCache {
	return &ImageCache{Dir: filepath.Join(build.DefaultCacheDir(), "test-images"), Keep: 4}
}

// completeMark is the file a finished entry holds: the key and when it was stored.
const completeMark = "cache-entry"

// Get returns the directory of key's entry, and whether it was there already. When it
// was not, make builds it: make fills dir (a new empty directory) or fails t. The
// entry's inputs are logged.
func (c *ImageCache) Get(t testing.TB, key *Key, make func(dir string)) (dir string, hit bool) {
	t.Helper()
	sum := key.Sum()
	dir = filepath.Join(c.Dir, sum)
	if _, err := os.Stat(filepath.Join(dir, completeMark)); err == nil {
		now := time.Now()
		os.Chtimes(dir, now, now) // most recently used
		t.Logf("image cache hit %s (%s)", sum[:12], dir)
		return dir, true
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		t.Fatalf("image cache: %v", err)
	}
	// A directory without the mark is a build that died before its rename could not
	// leave (the rename is atomic): that is another process's temporary name, never
	// this one. Remove a leftover at this name all the same, so the rename can land.
	if _, err := os.Stat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatalf("image cache: remove the incomplete entry %s: %v", dir, err)
		}
	}
	tmp, err := os.MkdirTemp(c.Dir, ".building-"+sum[:12]+"-")
	if err != nil {
		t.Fatalf("image cache: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) }) // gone after the rename; a failed build's leftovers
	t.Logf("image cache miss %s: building (key over %d inputs)", sum[:12], key.inputs)
	make(tmp)
	if t.Failed() {
		t.FailNow()
	}
	mark := fmt.Sprintf("key %s\nstored %s\n", sum, time.Now().UTC().Format(time.RFC3339))
	if err := os.WriteFile(filepath.Join(tmp, completeMark), []byte(mark), 0o644); err != nil {
		t.Fatalf("image cache: %v", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, completeMark)); serr == nil {
			t.Logf("image cache: another builder stored %s first; using its entry", sum[:12])
			return dir, false
		}
		t.Fatalf("image cache: store %s: %v", dir, err)
	}
	if err := c.prune(dir); err != nil {
		t.Logf("image cache: prune: %v", err) // a full cache is not a test failure
	}
	return dir, false
}

// prune removes all but the Keep most recently used entries, never keep.
func (c *ImageCache) prune(keep string) error {
	if c.Keep <= 0 {
		return nil
	}
	ents, err := os.ReadDir(c.Dir)
	if err != nil {
		return err
	}
	type entry struct {
		path string
		used time.Time
	}
	var done []entry
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		done = append(done, entry{filepath.Join(c.Dir, e.Name()), fi.ModTime()})
	}
	slices.SortFunc(done, func(a, b entry) int { return b.used.Compare(a.used) })
	var errs []error
	for i, e := range done {
		if i < c.Keep || e.path == keep {
			continue
		}
		errs = append(errs, os.RemoveAll(e.path))
	}
	return errors.Join(errs...)
}

// LinkTree recreates src (a file or a directory tree) at dst with hard links, copying
// where a link is not possible (another filesystem).
func LinkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return errors.New(p + " is not a regular file or directory")
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if os.Link(p, target) == nil {
			return nil
		}
		return copyFile(p, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

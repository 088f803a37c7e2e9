// Package debcache is the sha256-keyed .deb cache that keeps a lock buildable after the
// mirror drops superseded versions (no snapshot archive is reachable from the build
// hosts). Every entry is verified against the lock's sha256 before use; a corrupted
// entry is removed and fetched again, never used. It also writes the flat local
// repository that mmdebstrap installs from, so the build reads exactly the locked
// .debs and nothing else.
package debcache

import (
	"github.com/gpurack/gpurack/internal/manifest"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpurack/gpurack/internal/profile"
)

// Cache is a directory of .deb files named by their sha256.
type Cache struct {
	Dir string
	// Log receives one line per event worth an operator's attention (refetches).
	Log func(format string, args ...any)
	// Progress, if set, is called while downloading with bytes done and total.
	Progress func(name string, done, total int64)
	Client   *http.Client
}

// Path is where the .deb with that sha256 lives.
func (c *Cache) Path(sum string) string { return filepath.Join(c.Dir, "sha256", sum[:2], sum+".deb") }

// Has reports whether an entry exists (without verifying it).
func (c *Cache) Has(sum string) bool {
	_, err := os.Stat(c.Path(sum))
	return err == nil
}

// fileSHA256 is the lowercase hex sha256 of the file at path.
func fileSHA256(path string) (string, error) {
	d, err := manifest.DigestFile(path)
	return d.SHA256, err
}

// Get returns the path of a verified copy of lp, fetching it from the first of bases
// (archive base URLs) that has it when the cache lacks it or holds a corrupted copy.
func (c *Cache) Get(ctx context.Context, lp profile.LockedPackage, bases []string) (string, error) {
	path := c.Path(lp.SHA256)
	if sum, err := fileSHA256(path); err == nil {
		if sum == lp.SHA256 {
			return path, nil
		}
		c.logf("cache: %s %s: cached file %s has sha256 %s, not the locked %s; removing it and fetching again", lp.Name, lp.Version, path, sum, lp.SHA256)
		if err := os.Remove(path); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	var errs []error
	for _, base := range bases {
		url := strings.TrimRight(base, "/") + "/" + lp.Filename
		err := c.fetch(ctx, url, path, lp)
		if err == nil {
			return path, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("fetch %s %s (%s): not in the cache and no archive has it:\n  %w\nif the mirror dropped this version, import a cache that has it (gpuimage cache import) or re-lock the profile",
		lp.Name, lp.Version, lp.Filename, errors.Join(errs...))
}

func (c *Cache) logf(format string, args ...any) {
	if c.Log != nil {
		c.Log(format, args...)
	}
}

func (c *Cache) fetch(ctx context.Context, url, path string, lp profile.LockedPackage) error {
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	var r io.Reader = io.TeeReader(resp.Body, h)
	if c.Progress != nil {
		r = &progressReader{r: r, name: lp.Name, total: lp.Size, fn: c.Progress}
	}
	n, err := io.Copy(tmp, r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != lp.SHA256 || n != lp.Size {
		return fmt.Errorf("GET %s: got %d bytes with sha256 %s, the lock says %d bytes with sha256 %s", url, n, sum, lp.Size, lp.SHA256)
	}
	return os.Rename(tmp.Name(), path)
}

type progressReader struct {
	r           io.Reader
	name        string
	done, total int64
	fn          func(string, int64, int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	p.fn(p.name, p.done, p.total)
	return n, err
}

// WriteRepo writes a flat apt repository ("deb [trusted=yes] file:DIR ./") holding the
// given cached .debs. Trust comes from the lock: every file was checked against the
// sha256 recorded from the signed archive index.
//
// The repository's Release file names suite as its suite and codename, because
// mmdebstrap selects the essential and required sets from the archive of that name.
func WriteRepo(dir, suite string, debs map[string]profile.LockedPackage) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var pk strings.Builder
	names := make([]string, 0, len(debs))
	for path := range debs {
		names = append(names, path)
	}
	sortStrings(names)
	for _, path := range names {
		lp := debs[path]
		base := fmt.Sprintf("%s_%s_%s.deb", lp.Name, strings.ReplaceAll(lp.Version, ":", "%3a"), lp.Architecture)
		dst := filepath.Join(dir, base)
		os.Remove(dst)
		if err := os.Link(path, dst); err != nil {
			if err := os.Symlink(path, dst); err != nil {
				return err
			}
		}
		out, err := exec.Command("dpkg-deb", "--field", path).Output()
		if err != nil {
			return fmt.Errorf("read control of %s: %w", path, err)
		}
		pk.WriteString(strings.TrimRight(string(out), "\n"))
		fmt.Fprintf(&pk, "\nFilename: ./%s\nSize: %d\nSHA256: %s\n\n", base, lp.Size, lp.SHA256)
	}
	packages := []byte(pk.String())
	if err := os.WriteFile(filepath.Join(dir, "Packages"), packages, 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256(packages)
	release := fmt.Sprintf("Origin: gpurack\nLabel: gpurack\nSuite: %s\nCodename: %s\nArchitectures: amd64 all\nSHA256:\n %s %d Packages\n",
		suite, suite, hex.EncodeToString(sum[:]), len(packages))
	return os.WriteFile(filepath.Join(dir, "Release"), []byte(release), 0o644)
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

package debcache

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/profile"
)

var entryRE = regexp.MustCompile(`^([0-9a-f]{64})\.deb$`)

// Export writes the cache entries of the given locked packages (all entries when pkgs is
// nil) to w as a tar stream of sha256/xx/<sha256>.deb, sorted, with fixed metadata. A
// locked package missing from the cache is an error naming it.
func (c *Cache) Export(w io.Writer, pkgs []profile.LockedPackage) (int, error) {
	var sums []string
	if pkgs == nil {
		files, _ := filepath.Glob(filepath.Join(c.Dir, "sha256", "*", "*.deb"))
		for _, f := range files {
			if m := entryRE.FindStringSubmatch(filepath.Base(f)); m != nil {
				sums = append(sums, m[1])
			}
		}
	} else {
		var missing []string
		seen := map[string]bool{}
		for _, lp := range pkgs {
			if seen[lp.SHA256] {
				continue
			}
			seen[lp.SHA256] = true
			if !c.Has(lp.SHA256) {
				missing = append(missing, lp.Name+" "+lp.Version)
				continue
			}
			sums = append(sums, lp.SHA256)
		}
		if len(missing) > 0 {
			return 0, fmt.Errorf("the cache %s lacks %d locked packages (%s); run gpuimage build (which fetches them) first", c.Dir, len(missing), strings.Join(missing, ", "))
		}
	}
	sort.Strings(sums)
	tw := tar.NewWriter(w)
	for _, s := range sums {
		f, err := os.Open(c.Path(s))
		if err != nil {
			return 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return 0, err
		}
		hdr := &tar.Header{Name: path.Join("sha256", s[:2], s+".deb"), Mode: 0o644, Size: st.Size(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return 0, err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	return len(sums), tw.Close()
}

// Import reads a tar stream made by Export into the cache. Every entry is checked
// against the sha256 in its name; a mismatch is an error naming the entry, and nothing
// unverified is kept.
func (c *Cache) Import(r io.Reader) (added, present int, err error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return added, present, nil
		}
		if err != nil {
			return added, present, fmt.Errorf("read cache archive: %w", err)
		}
		if hdr.Typeflag == tar.TypeDir {
			continue
		}
		m := entryRE.FindStringSubmatch(path.Base(hdr.Name))
		if hdr.Typeflag != tar.TypeReg || m == nil || hdr.Name != path.Join("sha256", m[1][:2], m[1]+".deb") {
			return added, present, fmt.Errorf("cache archive entry %q is not sha256/xx/<sha256>.deb; is this a gpuimage cache export?", hdr.Name)
		}
		sum := m[1]
		if c.Has(sum) {
			if got, _ := fileSHA256(c.Path(sum)); got == sum {
				present++
				continue
			}
		}
		if err := os.MkdirAll(filepath.Dir(c.Path(sum)), 0o755); err != nil {
			return added, present, err
		}
		tmp, err := os.CreateTemp(filepath.Dir(c.Path(sum)), ".import-*")
		if err != nil {
			return added, present, err
		}
		h := sha256.New()
		_, err = io.Copy(io.MultiWriter(tmp, h), tr)
		tmp.Close()
		if err == nil && hex.EncodeToString(h.Sum(nil)) != sum {
			err = fmt.Errorf("cache archive entry %s has sha256 %s: the archive is corrupted", hdr.Name, hex.EncodeToString(h.Sum(nil)))
		}
		if err == nil {
			err = os.Rename(tmp.Name(), c.Path(sum))
		}
		if err != nil {
			os.Remove(tmp.Name())
			return added, present, err
		}
		added++
	}
}

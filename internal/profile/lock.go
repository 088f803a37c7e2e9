package profile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// LockSchemaVersion is the lock format this package reads and writes.
const LockSchemaVersion = 1

// Lock pins every input of an image built from one profile (CONTRACTS §8). It is
// written by `gpuimage lock` as profiles/NAME.lock.json and consumed by `gpuimage build`.
//
// The lock records where packages came from by suite and archive label, not by mirror
// URL: the same lock builds from any mirror (or from the sha256-keyed .deb cache, which
// is what keeps a lock buildable after the mirror drops superseded versions).
type Lock struct {
	SchemaVersion int `yaml:"schemaVersion" json:"schemaVersion"`
	// Profile is the profile's name.
	Profile string `yaml:"profile" json:"profile"`
	// ProfileDigest is Profile.Digest() of the profile this lock resolves. A different
	// digest makes the lock stale.
	ProfileDigest string `yaml:"profileDigest" json:"profileDigest"`
	// Release has one entry per suite and archive the resolution read.
	Release []Release `yaml:"release" json:"release"`
	// Packages is every package of the root filesystem, sorted by name and architecture.
	Packages []LockedPackage `yaml:"packages" json:"packages"`
	// Build is every build-only input: kernel headers, kbuild, DKMS sources and the
	// packages of the compiler chroot. None of them is shipped in the image.
	Build []LockedPackage `yaml:"build" json:"build"`
	// ExtraDebs are the vendor packages given by file in the profile.
	ExtraDebs []LockedExtraDeb `yaml:"extraDebs" json:"extraDebs"`
}

// Release identifies one signed Release file that the resolution trusted.
type Release struct {
	// Suite is the codename or suite path, e.g. bookworm or bookworm-security.
	Suite string `yaml:"suite" json:"suite"`
	// Archive is the archive's label from the Release file (Debian, Debian-Security),
	// or the profile's mirror when one is set. It never defaults to a host name.
	Archive string `yaml:"archive" json:"archive"`
	// Digest is "sha256:HEX" of the InRelease file.
	Digest string `yaml:"digest" json:"digest"`
	// Date is the Release file's Date field, as written there.
	Date string `yaml:"date" json:"date"`
}

// LockedPackage is one .deb pinned by version and content.
type LockedPackage struct {
	Name         string `yaml:"name" json:"name"`
	Version      string `yaml:"version" json:"version"`
	Architecture string `yaml:"architecture" json:"architecture"`
	// Area is the archive area: main, contrib, non-free or non-free-firmware.
	Area string `yaml:"area" json:"area"`
	// Filename is the pool path, relative to the archive base.
	Filename string `yaml:"filename" json:"filename"`
	Size     int64  `yaml:"size" json:"size"`
	SHA256   string `yaml:"sha256" json:"sha256"`
}

// LockedExtraDeb is a vendor .deb from the profile, with the fields read from it.
type LockedExtraDeb struct {
	File         string `yaml:"file" json:"file"`
	Name         string `yaml:"name" json:"name"`
	Version      string `yaml:"version" json:"version"`
	Architecture string `yaml:"architecture" json:"architecture"`
	Size         int64  `yaml:"size" json:"size"`
	SHA256       string `yaml:"sha256" json:"sha256"`
}

// LoadLock reads and validates the lock file at path.
func LoadLock(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read lock file: %w", err)
	}
	return ParseLock(path, data)
}

// ParseLock decodes and validates a lock file. Unknown fields are errors; every error
// names file, line and field.
func ParseLock(file string, data []byte) (*Lock, error) {
	var l Lock
	pos, err := strictyaml.Decode(file, data, &l)
	if err != nil {
		return nil, err
	}
	v := validator{file: file, pos: pos}
	v.lock(&l)
	if len(v.errs) > 0 {
		return nil, v.errs.Sorted()
	}
	return &l, nil
}

// LockPath is where the lock of the profile at profilePath lives: beside it, as
// NAME.lock.json.
func LockPath(profilePath string) string {
	dir, base := path.Split(profilePath)
	base = strings.TrimSuffix(strings.TrimSuffix(base, ".yaml"), ".yml")
	return dir + base + ".lock.json"
}

// Marshal returns the lock's canonical bytes: lists sorted, two-space indent, a final
// newline. The same lock gives the same bytes, so locks diff cleanly in review.
func (l *Lock) Marshal() ([]byte, error) {
	c := *l
	c.SchemaVersion = LockSchemaVersion
	c.Packages = sortedPackages(l.Packages)
	c.Build = sortedPackages(l.Build)
	c.ExtraDebs = append([]LockedExtraDeb{}, l.ExtraDebs...)
	sort.Slice(c.ExtraDebs, func(i, j int) bool { return c.ExtraDebs[i].File < c.ExtraDebs[j].File })
	c.Release = append([]Release{}, l.Release...)
	sort.Slice(c.Release, func(i, j int) bool {
		return c.Release[i].Suite+"\x00"+c.Release[i].Archive < c.Release[j].Suite+"\x00"+c.Release[j].Archive
	})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sortedPackages(in []LockedPackage) []LockedPackage {
	out := append([]LockedPackage{}, in...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Architecture < out[j].Architecture
	})
	return out
}

// Find returns the locked root-filesystem package with that name, or nil.
func (l *Lock) Find(name string) *LockedPackage {
	for i := range l.Packages {
		if l.Packages[i].Name == name {
			return &l.Packages[i]
		}
	}
	return nil
}

var (
	digestRE     = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	debVersionRE = regexp.MustCompile(`^([0-9]+:)?[0-9][A-Za-z0-9.+~:-]*$`)
	archRE       = regexp.MustCompile(`^(all|amd64|arm64|i386|armhf|ppc64el|s390x|riscv64)$`)
)

func (v *validator) lock(l *Lock) {
	if l.SchemaVersion != LockSchemaVersion {
		v.fail("schemaVersion", "is %d; this gpuimage reads version %d (re-run gpuimage lock)", l.SchemaVersion, LockSchemaVersion)
	}
	if v.required("profile", l.Profile, "profile: tiny") && !nameRE.MatchString(l.Profile) {
		v.fail("profile", "%q is not a valid profile name", l.Profile)
	}
	if !digestRE.MatchString(l.ProfileDigest) {
		v.fail("profileDigest", "must be sha256: followed by 64 lowercase hex digits (re-run gpuimage lock)")
	}
	if len(l.Release) == 0 {
		v.fail("release", "lists no Release file; a lock must say which signed archive it resolved (re-run gpuimage lock)")
	}
	for i, r := range l.Release {
		f := fmt.Sprintf("release[%d]", i)
		v.required(f+".suite", r.Suite, "suite: bookworm")
		v.required(f+".archive", r.Archive, "archive: Debian")
		if !digestRE.MatchString(r.Digest) {
			v.fail(f+".digest", "must be sha256: followed by 64 lowercase hex digits")
		}
		v.required(f+".date", r.Date, "date: Sat, 15 Nov 2025 10:00:00 UTC")
	}
	if len(l.Packages) == 0 {
		v.fail("packages", "is empty; a root filesystem needs packages (re-run gpuimage lock)")
	}
	v.lockedPackages("packages", l.Packages)
	v.lockedPackages("build", l.Build)
	for i, d := range l.ExtraDebs {
		f := fmt.Sprintf("extraDebs[%d]", i)
		v.required(f+".file", d.File, "file: debs/vendor.deb")
		v.packageFields(f, d.Name, d.Version, d.Architecture, d.Size, d.SHA256)
	}
}

func (v *validator) lockedPackages(list string, pkgs []LockedPackage) {
	seen := map[string]int{}
	for i, p := range pkgs {
		f := fmt.Sprintf("%s[%d]", list, i)
		v.packageFields(f, p.Name, p.Version, p.Architecture, p.Size, p.SHA256)
		if !areas[p.Area] {
			v.fail(f+".area", "unknown archive area %q; use main, contrib, non-free or non-free-firmware", p.Area)
		}
		if p.Filename == "" || strings.HasPrefix(p.Filename, "/") || strings.Contains(p.Filename, "..") || !strings.HasSuffix(p.Filename, ".deb") {
			v.fail(f+".filename", "%q must be a relative pool path ending in .deb, without ..", p.Filename)
		}
		key := p.Name + ":" + p.Architecture
		if j, dup := seen[key]; dup {
			v.fail(f, "%s is also locked at %s[%d]; a lock pins one version of each package", key, list, j)
		}
		seen[key] = i
	}
}

func (v *validator) packageFields(f, name, version, arch string, size int64, sum string) {
	if v.required(f+".name", name, "name: systemd") && !debNameRE.MatchString(name) {
		v.fail(f+".name", "%q is not a Debian package name", name)
	}
	if v.required(f+".version", version, "version: 252.39-1~deb12u1") && !debVersionRE.MatchString(version) {
		v.fail(f+".version", "%q is not a Debian version", version)
	}
	if !archRE.MatchString(arch) {
		v.fail(f+".architecture", "%q is not a Debian architecture such as amd64 or all", arch)
	}
	if size <= 0 {
		v.fail(f+".size", "must be the .deb's size in bytes, got %d", size)
	}
	if !sha256RE.MatchString(sum) {
		v.fail(f+".sha256", "must be 64 lowercase hex digits")
	}
}

package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// KindContainer is the kind of a workload image profile. A node profile has no kind
// field; a container profile must say `kind: container` on its first lines, which is
// how gpuimage tells the two apart.
const KindContainer = "container"

// Container is a workload image profile (docs/workload-images.md): an OCI image made
// of pinned Debian packages, files from the profile's folder and an image config. Its
// packages are resolved and pinned by the same lock as a node profile's (Lock,
// CONTRACTS §8); Digest covers the whole profile, so any change makes the lock stale.
type Container struct {
	// Kind is always KindContainer.
	Kind string `yaml:"kind" json:"kind"`
	// Name is the profile's name, as for a node profile: it matches the file name.
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Base is the Debian suite (and optionally the archive, such as a snapshot) the
	// packages come from.
	Base Base `yaml:"base" json:"base"`
	// Packages are installed besides Debian's Essential set.
	Packages []string `yaml:"packages,omitempty" json:"packages,omitempty"`
	// Files are copied from the profile's folder into the image.
	Files []ContainerFile `yaml:"files,omitempty" json:"files,omitempty"`
	Image ImageSpec       `yaml:"image" json:"image"`
}

// ContainerFile is one file added to the image.
type ContainerFile struct {
	// Source is relative to the profile's folder and stays inside it.
	Source string `yaml:"source" json:"source"`
	// Path is the absolute path in the image.
	Path string `yaml:"path" json:"path"`
	// Mode is the octal permission, as a string ("0755"); default "0644". The file is
	// owned by root: the image's user reads it and cannot change it.
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
}

// ImageSpec is the image's name and its OCI config.
type ImageSpec struct {
	// Name is the repository with its registry host, e.g. gpurack.example/workloads/train.
	Name string `yaml:"name" json:"name"`
	Tag  string `yaml:"tag" json:"tag"`
	// User is the account the image runs as; never root.
	User ContainerUser `yaml:"user" json:"user"`
	// Workdir is the working directory, owned by User; default User's home /work.
	Workdir    string            `yaml:"workdir,omitempty" json:"workdir,omitempty"`
	Env        map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	Entrypoint []string          `yaml:"entrypoint,omitempty" json:"entrypoint,omitempty"`
	Cmd        []string          `yaml:"cmd,omitempty" json:"cmd,omitempty"`
	// Ports are exposed ports, "8888/tcp" or "53/udp" ("8888" means tcp).
	Ports  []string          `yaml:"ports,omitempty" json:"ports,omitempty"`
	Labels map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
}

// ContainerUser is the image's non-root account, added to /etc/passwd and /etc/group.
type ContainerUser struct {
	Name string `yaml:"name" json:"name"`
	// UID and GID are at least MinContainerID: the uids below are the system's.
	UID int64 `yaml:"uid" json:"uid"`
	GID int64 `yaml:"gid" json:"gid"`
}

// MinContainerID is the smallest uid and gid a container profile's user may have.
const MinContainerID = 1000

// maxContainerID is the largest: uid_t is 32 bits, and 2^32-1 means "no uid".
const maxContainerID = 1<<31 - 1

// DefaultWorkdir is the working directory when the profile sets none.
const DefaultWorkdir = "/work"

// Ref is the image's full reference, NAME:TAG.
func (c *Container) Ref() string { return c.Image.Name + ":" + c.Image.Tag }

// Canonical is the profile as canonical JSON, defaults applied; Digest covers it.
func (c *Container) Canonical() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic("profile: canonical JSON: " + err.Error())
	}
	return b
}

// Digest is "sha256:" plus the hex sha256 of Canonical: a lock's profileDigest.
func (c *Container) Digest() string {
	sum := sha256.Sum256(c.Canonical())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// FileMode is f's mode as a number (Mode is checked by validation).
func (f ContainerFile) FileMode() os.FileMode {
	m, _ := strconv.ParseUint(f.Mode, 8, 32)
	return os.FileMode(m)
}

// KindOf returns the kind field of a profile's YAML: KindContainer, or "" for a node
// profile. A file that is not YAML gives "", and the node parser then reports it.
func KindOf(data []byte) string {
	var k struct {
		Kind string `yaml:"kind"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return ""
	}
	return k.Kind
}

// IsContainerFile reports whether the profile at path is a container profile.
func IsContainerFile(path string) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read profile: %w", err)
	}
	return KindOf(data) == KindContainer, nil
}

// LoadContainer reads and validates the container profile at path and checks that
// every files[].source exists in its folder, naming the field and line when not.
func LoadContainer(path string) (*Container, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	c, pos, err := parseContainer(path, data)
	if err != nil {
		return nil, err
	}
	v := validator{file: path, pos: pos}
	for i, f := range c.Files {
		st, err := os.Stat(filepath.Join(filepath.Dir(path), f.Source))
		switch {
		case os.IsNotExist(err):
			v.fail(fmt.Sprintf("files[%d].source", i), "%s does not exist in the profile's folder %s", f.Source, filepath.Dir(path))
		case err != nil:
			v.fail(fmt.Sprintf("files[%d].source", i), "%v", err)
		case !st.Mode().IsRegular():
			v.fail(fmt.Sprintf("files[%d].source", i), "%s is not a regular file", f.Source)
		}
	}
	if len(v.errs) > 0 {
		return nil, v.errs.Sorted()
	}
	return c, nil
}

// ParseContainer decodes and validates a container profile; file names it in errors,
// each with its line and field. It reads no other file.
func ParseContainer(file string, data []byte) (*Container, error) {
	c, _, err := parseContainer(file, data)
	return c, err
}

func parseContainer(file string, data []byte) (*Container, strictyaml.Positions, error) {
	var c Container
	pos, err := strictyaml.Decode(file, data, &c)
	if err != nil {
		return nil, nil, err
	}
	if len(c.Base.Components) == 0 {
		c.Base.Components = []string{"main"}
	}
	if c.Image.Workdir == "" {
		c.Image.Workdir = DefaultWorkdir
	}
	for i := range c.Files {
		if c.Files[i].Mode == "" {
			c.Files[i].Mode = "0644"
		}
	}
	v := validator{file: file, pos: pos}
	v.container(&c)
	if len(v.errs) > 0 {
		return nil, nil, v.errs.Sorted()
	}
	return &c, pos, nil
}

var (
	userNameRE  = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	envNameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	portRE      = regexp.MustCompile(`^([0-9]{1,5})(/(tcp|udp|sctp))?$`)
	fileModeRE  = regexp.MustCompile(`^0?[0-7]{3}$`)
	repoPathRE  = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)
	registryRE  = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?)$`)
	imageTagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	labelAnyKey = regexp.MustCompile(`^[^\x00-\x1f=]{1,255}$`)
)

func (v *validator) container(c *Container) {
	if c.Kind != KindContainer {
		v.fail("kind", "is %q; a container profile says kind: %s", c.Kind, KindContainer)
	}
	if v.required("name", c.Name, "name: train") && !nameRE.MatchString(c.Name) {
		v.fail("name", "%q is not a valid name; use lowercase letters, digits and '-' (at most 63)", c.Name)
	}
	v.base(&c.Base)
	v.packages(c.Packages)
	v.containerFiles(c.Files)
	v.imageName(&c.Image)
	v.containerUser(&c.Image.User)
	v.imageConfig(&c.Image)
}

func (v *validator) containerFiles(files []ContainerFile) {
	seen := map[string]bool{}
	for i, f := range files {
		fld := fmt.Sprintf("files[%d]", i)
		if v.required(fld+".source", f.Source, "source: train.py") {
			clean := path.Clean(filepath.ToSlash(f.Source))
			if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || clean == "." {
				v.fail(fld+".source", "%q must be a file in the profile's folder (relative, without ..)", f.Source)
			}
		}
		if v.required(fld+".path", f.Path, "path: /opt/train/train.py") {
			switch {
			case !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/":
				v.fail(fld+".path", "%q must be a clean absolute file path in the image", f.Path)
			case f.Path == "/etc/passwd" || f.Path == "/etc/group":
				v.fail(fld+".path", "%s is written from image.user; do not replace it", f.Path)
			case seen[f.Path]:
				v.fail(fld+".path", "%s is added twice", f.Path)
			}
			seen[f.Path] = true
		}
		if !fileModeRE.MatchString(f.Mode) {
			v.fail(fld+".mode", "%q is not an octal permission such as \"0644\" or \"0755\" (quote it)", f.Mode)
		}
	}
}

func (v *validator) imageName(im *ImageSpec) {
	if v.required("image.name", im.Name, "name: gpurack.example/workloads/train") {
		host, repo, ok := strings.Cut(im.Name, "/")
		switch {
		case !ok || !(strings.ContainsAny(host, ".:") || host == "localhost") || !registryRE.MatchString(host):
			v.fail("image.name", "%q must start with a registry host, as in gpurack.example/workloads/train", im.Name)
		case len(im.Name) > 255 || !repoPathRE.MatchString(repo):
			v.fail("image.name", "%q is not a repository name: after the host, lowercase path components of letters, digits and . _ -", im.Name)
		}
	}
	if v.required("image.tag", im.Tag, `tag: "1.0"`) && !imageTagRE.MatchString(im.Tag) {
		v.fail("image.tag", "%q is not a tag: letters, digits, _ . - (at most 128, not starting with . or -)", im.Tag)
	}
}

func (v *validator) containerUser(u *ContainerUser) {
	if v.required("image.user.name", u.Name, "name: trainer") {
		switch {
		case u.Name == "root":
			v.fail("image.user.name", "the image must not run as root; name a user of its own")
		case !userNameRE.MatchString(u.Name):
			v.fail("image.user.name", "%q is not a user name: lowercase letters, digits, _ and -, at most 32", u.Name)
		}
	}
	for _, id := range []struct {
		field string
		n     int64
	}{{"image.user.uid", u.UID}, {"image.user.gid", u.GID}} {
		switch {
		case id.n == 0:
			v.fail(id.field, "is 0 (root, or left out); the image must not run as root: use %d or more", MinContainerID)
		case id.n < MinContainerID:
			v.fail(id.field, "is %d, a system id; use %d or more", id.n, MinContainerID)
		case id.n > maxContainerID:
			v.fail(id.field, "is %d; the largest is %d", id.n, maxContainerID)
		}
	}
}

func (v *validator) imageConfig(im *ImageSpec) {
	if !path.IsAbs(im.Workdir) || path.Clean(im.Workdir) != im.Workdir || im.Workdir == "/" {
		v.fail("image.workdir", "%q must be a clean absolute directory other than /", im.Workdir)
	}
	for _, k := range sortedKeys(im.Env) {
		if !envNameRE.MatchString(k) {
			v.fail("image.env."+k, "%q is not an environment variable name", k)
		}
	}
	if len(im.Entrypoint) == 0 && len(im.Cmd) == 0 {
		v.fail("image.entrypoint", "the image needs an entrypoint or a cmd to run")
	}
	seen := map[string]bool{}
	for i, p := range im.Ports {
		f := fmt.Sprintf("image.ports[%d]", i)
		m := portRE.FindStringSubmatch(p)
		if m == nil {
			v.fail(f, "%q is not a port such as 8888/tcp", p)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n < 1 || n > 65535 {
			v.fail(f, "port %s is outside 1-65535", m[1])
		}
		if seen[p] {
			v.fail(f, "%q is listed twice", p)
		}
		seen[p] = true
	}
	for _, k := range sortedKeys(im.Labels) {
		if !labelAnyKey.MatchString(k) {
			v.fail("image.labels."+k, "%q is not a label key", k)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

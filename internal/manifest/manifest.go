package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// SchemaVersion is the manifest schema this package reads and writes.
const SchemaVersion = 1

// File names in an image directory (docs/contracts.md §7).
const (
	ManifestFile  = "manifest.json"
	SignatureFile = "manifest.sig"

	ArtifactKernel  = "vmlinuz"
	ArtifactInitrd  = "initrd.img"
	ArtifactRootfs  = "rootfs.squashfs"
	ArtifactCmdline = "cmdline"
	ArtifactSBOM    = "sbom.spdx.json"
)

// Names of the binaries whose digests enter the image id.
const (
	BinaryAgent   = "gpuagent"
	BinaryKubelet = "kubelet"
	// BinaryKubeProxy is kube-proxy (decision 0602).
	BinaryKubeProxy = "kube-proxy"
	// BinaryNodeExporter is node_exporter, the node's metrics (decision 0693).
	BinaryNodeExporter = "node_exporter"
)

// Driver flavors (the NVIDIA kernel module variants).
const (
	FlavorOpen        = "open"
	FlavorProprietary = "proprietary"
)

// MaxManifestSize bounds manifest.json; Parse and VerifyDir refuse larger
// input. Real manifests are a few kilobytes.
const MaxManifestSize = 1 << 20

// requiredArtifacts must be listed in every manifest: the files gpuboot
// serves to a booting machine and the SBOM.
var requiredArtifacts = []string{ArtifactKernel, ArtifactInitrd, ArtifactRootfs, ArtifactCmdline, ArtifactSBOM}

// requiredBinaries must be listed in every manifest's binaries.
var requiredBinaries = []string{BinaryAgent, BinaryKubelet}

// Manifest describes one built image. Its JSON form (manifest.json) is what
// gets signed; field names are camelCase and appear in the order below.
type Manifest struct {
	// SchemaVersion is always SchemaVersion (1).
	SchemaVersion int `json:"schemaVersion"`
	// ImageID is the image id (see ImageID): 40 lowercase hex characters,
	// also the image's directory name in the store.
	ImageID string `json:"imageId"`
	// Profile is the name of the profile the image was built from
	// (profiles/NAME.yaml).
	Profile string `json:"profile"`
	// ProfileDigest and LockDigest are the SHA-256 of the canonical profile
	// and of the lock file: 64 lowercase hex characters, optionally
	// prefixed with "sha256:".
	ProfileDigest string `json:"profileDigest"`
	LockDigest    string `json:"lockDigest"`
	// BuilderVersion is the version of gpuimage that built the image.
	BuilderVersion string `json:"builderVersion"`
	// SourceDateEpoch is the SOURCE_DATE_EPOCH the build ran with, in
	// seconds since the Unix epoch: every timestamp in the image is it.
	SourceDateEpoch int64 `json:"sourceDateEpoch"`
	// Kernel is the image's kernel.
	Kernel Kernel `json:"kernel"`
	// Driver is the NVIDIA driver built into the image; absent for an
	// image without GPU support.
	Driver *Driver `json:"driver,omitempty"`
	// GPUSimulator is the simulator model of a simulated GPU image (profile
	// gpu.simulator): its GPUs are the agent's simulator, it has no driver, and its
	// nodes are labelled simulated (CONTRACTS §11). Absent for every other image.
	GPUSimulator string `json:"gpuSimulator,omitempty"`
	// KubernetesVersion is the version of the kubelet in the image, for
	// example "v1.31.4".
	KubernetesVersion string `json:"kubernetesVersion"`
	// Binaries are the gpurack-built binaries inside the rootfs, by name
	// (at least "gpuagent" and "kubelet"); their digests enter the image id.
	Binaries map[string]FileDigest `json:"binaries"`
	// Artifacts are the image directory's files, sorted by name. Each is a
	// plain file name in the image directory.
	Artifacts []Artifact `json:"artifacts"`
	// Images are the container image archives the rootfs ships, in the
	// profile's order; gpurack-images.service imports them into containerd
	// at boot. Their digests enter the image id. Absent when the profile
	// lists none.
	Images []ImageArchive `json:"images,omitempty"`
}

// ImagesDir is where the rootfs keeps the container image archives it
// ships (the pause image's pause.tar and the profile's images).
const ImagesDir = "/usr/share/gpurack/images"

// ImageArchive is one container image archive inside the rootfs.
type ImageArchive struct {
	// Path is the archive's absolute path in the rootfs, under ImagesDir.
	Path string `json:"path"`
	// SHA256 and Size are the archive file's lowercase hex SHA-256 and its
	// size in bytes.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Names are the image references the archive carries, as containerd
	// names them (docker.io/library/busybox:latest): what a pod refers to.
	Names []string `json:"names"`
}

// Kernel identifies the image's kernel.
type Kernel struct {
	// Version is the kernel release (uname -r), for example "6.1.0-28-amd64".
	Version string `json:"version"`
	// Package is the Debian package it came from, for example
	// "linux-image-6.1.0-28-amd64".
	Package string `json:"package"`
}

// Driver identifies the NVIDIA kernel driver built into the image.
type Driver struct {
	// Version is the driver version, for example "550.127.08".
	Version string `json:"version"`
	// Flavor is FlavorOpen or FlavorProprietary.
	Flavor string `json:"flavor"`
	// Vermagic is the modules' vermagic string, which must match the
	// kernel's (trailing space included, as modinfo prints it).
	Vermagic string `json:"vermagic"`
}

// FileDigest is a file's size in bytes and lowercase hex SHA-256.
type FileDigest struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Artifact is one file of the image directory.
type Artifact struct {
	// Name is the file's name in the image directory and in the URL
	// /images/<image-id>/<name>.
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Artifact returns the artifact called name and whether it is listed.
func (m *Manifest) Artifact(name string) (Artifact, bool) {
	for _, a := range m.Artifacts {
		if a.Name == name {
			return a, true
		}
	}
	return Artifact{}, false
}

// Marshal returns the canonical bytes of m, the bytes that get signed: the
// fields in the order of the Manifest type, binaries sorted by name,
// artifacts sorted by name, two-space indentation, no HTML escaping, and a
// trailing newline. The same manifest always gives the same bytes. m is
// validated first (see Validate) and is not modified.
func Marshal(m *Manifest) ([]byte, error) {
	if m == nil {
		return nil, errors.New("marshal manifest: nil manifest")
	}
	c := *m
	c.Artifacts = slices.Clone(m.Artifacts)
	sortArtifacts(c.Artifacts)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&c); err != nil {
		return nil, fmt.Errorf("marshal manifest: %w", err)
	}
	return buf.Bytes(), nil
}

// Parse decodes and validates manifest.json. It is strict: unknown fields,
// field names that differ from the schema only in case, duplicate fields,
// null where a value is required, trailing data, invalid UTF-8 and input
// over MaxManifestSize are errors, as is anything Validate refuses. The
// returned manifest's artifacts are sorted by name. Parse checks no
// signature: use Verify on the same bytes first (VerifyDir does both).
func Parse(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("manifest is %d bytes, more than the %d a manifest may have", len(data), MaxManifestSize)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("manifest is not valid UTF-8")
	}
	if err := checkKeys(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("manifest field %s: want a %s, found a JSON %s", te.Field, jsonKind(te.Type), te.Value)
		}
		return nil, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	sortArtifacts(m.Artifacts)
	return &m, nil
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int64:
		return "whole number"
	case reflect.Struct, reflect.Map:
		return "JSON object"
	case reflect.Slice:
		return "JSON array"
	}
	return t.String()
}

func sortArtifacts(as []Artifact) {
	slices.SortFunc(as, func(a, b Artifact) int { return strings.Compare(a.Name, b.Name) })
}

// problems collects what Validate finds, each naming its field.
type problems []error

func (p *problems) bad(field, format string, args ...any) {
	*p = append(*p, fmt.Errorf("manifest field %s: %s", field, fmt.Sprintf(format, args...)))
}

// text checks that v is plain text (checkText).
func (p *problems) text(field, v string) {
	if err := checkText(v); err != nil {
		p.bad(field, "%v", err)
	}
}

// file checks a listed file's SHA-256 and size.
func (p *problems) file(field, sha256 string, size int64) {
	if !isHex(sha256, 64) {
		p.bad(field+".sha256", "%q must be 64 lowercase hex characters", sha256)
	}
	if size < 0 {
		p.bad(field+".size", "%d is negative", size)
	}
}

// Validate checks every field of m and returns all the problems found, each
// naming its field and what a valid value looks like.
func (m *Manifest) Validate() error {
	var p problems
	m.validateBuild(&p)
	m.validateBinaries(&p)
	listed := m.validateArtifacts(&p)
	m.validateImages(&p)
	for _, name := range requiredArtifacts {
		if !listed[name] {
			p.bad("artifacts", "%q is missing: every image lists %s", name, strings.Join(quoteAll(requiredArtifacts), ", "))
		}
	}
	return errors.Join(p...)
}

// validateBuild checks the schema version and what the image was built from.
func (m *Manifest) validateBuild(p *problems) {
	switch {
	case m.SchemaVersion == 0:
		p.bad("schemaVersion", "missing: want %d", SchemaVersion)
	case m.SchemaVersion != SchemaVersion:
		p.bad("schemaVersion", "%d is not supported: this gpurack reads version %d; upgrade it to read this image", m.SchemaVersion, SchemaVersion)
	}
	if !isHex(m.ImageID, 40) {
		p.bad("imageId", "%q must be 40 lowercase hex characters (see docs/contracts.md §7)", m.ImageID)
	}
	if err := checkName(m.Profile); err != nil {
		p.bad("profile", "%v", err)
	}
	for _, d := range []struct{ field, v string }{{"profileDigest", m.ProfileDigest}, {"lockDigest", m.LockDigest}} {
		if !isHex(strings.TrimPrefix(d.v, "sha256:"), 64) {
			p.bad(d.field, "%q must be a SHA-256: 64 lowercase hex characters, optionally prefixed with \"sha256:\"", d.v)
		}
	}
	p.text("builderVersion", m.BuilderVersion)
	if m.SourceDateEpoch < 0 {
		p.bad("sourceDateEpoch", "%d is negative: want the build's SOURCE_DATE_EPOCH in seconds", m.SourceDateEpoch)
	}
	p.text("kernel.version", m.Kernel.Version)
	p.text("kernel.package", m.Kernel.Package)
	if d := m.Driver; d != nil {
		p.text("driver.version", d.Version)
		if d.Flavor != FlavorOpen && d.Flavor != FlavorProprietary {
			p.bad("driver.flavor", "%q must be %q or %q", d.Flavor, FlavorOpen, FlavorProprietary)
		}
		p.text("driver.vermagic", d.Vermagic)
	}
	p.text("kubernetesVersion", m.KubernetesVersion)
}

func (m *Manifest) validateBinaries(p *problems) {
	for _, name := range slices.Sorted(maps.Keys(m.Binaries)) {
		d := m.Binaries[name]
		field := fmt.Sprintf("binaries[%q]", name)
		if err := checkFileName(name); err != nil {
			p.bad(field, "the binary name: %v", err)
		}
		p.file(field, d.SHA256, d.Size)
	}
	for _, name := range requiredBinaries {
		if _, ok := m.Binaries[name]; !ok {
			p.bad("binaries", "%q is missing: every image lists %s", name, strings.Join(quoteAll(requiredBinaries), " and "))
		}
	}
}

// validateArtifacts checks the artifacts and returns the names listed.
func (m *Manifest) validateArtifacts(p *problems) map[string]bool {
	seen := map[string]bool{}
	for i, a := range m.Artifacts {
		field := fmt.Sprintf("artifacts[%d]", i)
		if err := checkFileName(a.Name); err != nil {
			p.bad(field+".name", "%v", err)
		} else if a.Name == ManifestFile || a.Name == SignatureFile {
			p.bad(field+".name", "%q cannot be an artifact: the manifest and its signature do not list themselves", a.Name)
		} else {
			field = fmt.Sprintf("artifacts[%q]", a.Name)
		}
		if seen[a.Name] {
			p.bad(field, "listed more than once: each file appears once")
		}
		seen[a.Name] = true
		p.file(field, a.SHA256, a.Size)
	}
	return seen
}

func (m *Manifest) validateImages(p *problems) {
	seen := map[string]bool{}
	for i, im := range m.Images {
		field := fmt.Sprintf("images[%d]", i)
		if dir, base := path.Split(im.Path); dir != ImagesDir+"/" || checkFileName(base) != nil {
			p.bad(field+".path", "%q must be a plain file name in %s", im.Path, ImagesDir)
		} else if seen[im.Path] {
			p.bad(field+".path", "%q is listed more than once", im.Path)
		}
		seen[im.Path] = true
		p.file(field, im.SHA256, im.Size)
		if len(im.Names) == 0 {
			p.bad(field+".names", "missing: an archive ships only with a name a pod can refer to")
		}
		for j, n := range im.Names {
			p.text(fmt.Sprintf("%s.names[%d]", field, j), n)
			if strings.ContainsRune(n, ' ') {
				p.bad(fmt.Sprintf("%s.names[%d]", field, j), "%q must be an image reference, without spaces", n)
			}
		}
	}
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// isHex reports whether s is exactly n lowercase hex digits.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checkFileName accepts a plain file name that is safe in a directory and
// in a URL path: 1 to 255 characters from [A-Za-z0-9._+-], not starting
// with '.' (which also rules out "." and "..").
func checkFileName(name string) error {
	if name == "" {
		return errors.New("empty: want a file name such as \"rootfs.squashfs\"")
	}
	if len(name) > 255 {
		return fmt.Errorf("%.40q… is longer than 255 characters", name)
	}
	if strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("%q contains a path separator: want a plain file name in the image directory", name)
	}
	if name[0] == '.' {
		return fmt.Errorf("%q starts with '.': want a plain file name in the image directory", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._+-", c) >= 0) {
			return fmt.Errorf("%q contains %q: use only letters, digits and . _ + -", name, c)
		}
	}
	return nil
}

// checkName accepts a profile name: 1 to 253 characters from
// [A-Za-z0-9._-], not starting with '.'.
func checkName(name string) error {
	if err := checkFileName(name); err != nil {
		return err
	}
	if strings.Contains(name, "+") || len(name) > 253 {
		return fmt.Errorf("%q: a profile name is 1 to 253 letters, digits, '.', '_' or '-'", name)
	}
	return nil
}

// checkText accepts a required free-text value: not blank, at most 1024
// bytes, only printable characters (the ASCII space is the only space).
func checkText(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("missing or blank")
	}
	if len(s) > 1024 {
		return fmt.Errorf("%.40q… is longer than 1024 bytes", s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return fmt.Errorf("%q contains a control, non-printing or invalid character", s)
		}
	}
	return nil
}

// maxDepth bounds JSON nesting in Parse; a manifest nests three deep.
const maxDepth = 16

// checkKeys walks data's JSON tokens alongside the Manifest type and
// refuses what encoding/json would quietly accept: a key that matches a
// field only case-insensitively, a key given twice (the last would win, and
// another reader could take the first), null for a field that is not
// optional, and data after the manifest object.
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := walk(dec, reflect.TypeFor[Manifest](), "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("manifest has data after its closing '}': a manifest is exactly one JSON object")
	}
	return nil
}

// walk consumes one JSON value from dec. t is the Go type the value decodes
// into, or nil when the value does not fit the schema (Decode then reports
// the mismatch); path names the value in errors.
func walk(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("manifest is nested more than %d deep at %s: not a gpurack manifest", maxDepth, pathOr(path))
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	optional := false
	if t != nil && t.Kind() == reflect.Pointer {
		t, optional = t.Elem(), true
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return fmt.Errorf("manifest is not valid JSON: %w", err)
			}
			key, _ := kt.(string)
			sub := key
			if t != nil && t.Kind() == reflect.Map {
				sub = fmt.Sprintf("%s[%q]", path, key)
			} else if path != "" {
				sub = path + "." + key
			}
			if seen[key] {
				return fmt.Errorf("manifest field %s appears more than once: give each field once", sub)
			}
			seen[key] = true
			var ft reflect.Type
			if t != nil {
				switch t.Kind() {
				case reflect.Struct:
					ft = fieldType(t, key)
					if ft == nil {
						return fmt.Errorf("manifest field %s is unknown%s", sub, didYouMean(t, key))
					}
				case reflect.Map:
					ft = t.Elem()
				}
			}
			if err := walk(dec, ft, sub, depth+1); err != nil {
				return err
			}
		}
		_, err := dec.Token() // '}'
		return err
	case json.Delim('['):
		var et reflect.Type
		if t != nil && t.Kind() == reflect.Slice {
			et = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, et, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	case nil:
		if t != nil && !optional {
			return fmt.Errorf("manifest field %s is null: give a value", pathOr(path))
		}
	}
	return nil
}

func pathOr(path string) string {
	if path == "" {
		return "(top level)"
	}
	return path
}

// fieldType returns the type of t's field whose JSON name is exactly key.
func fieldType(t reflect.Type, key string) reflect.Type {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == key {
			return f.Type
		}
	}
	return nil
}

func didYouMean(t reflect.Type, key string) string {
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if strings.EqualFold(name, key) {
			return fmt.Sprintf(": field names are case-sensitive, did you mean %q?", name)
		}
	}
	return ": remove it, or upgrade gpurack if a newer gpuimage wrote it"
}

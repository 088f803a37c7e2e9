// Package ociarchive reads and writes container image archives, the two tar formats
// that `ctr images import` accepts:
//
//   - a docker archive, as `docker save` writes it: manifest.json (a list of
//     {Config, RepoTags, Layers}), the image configs and the layer tars;
//   - an OCI image layout in a tar (OCI image-layout spec v1.0): oci-layout,
//     index.json and blobs/sha256/HEX.
//
// Docker 25 and later write both at once; both are then checked.
//
// Inspect checks an archive before gpuimage ships it in a node image: every manifest,
// config and layer that the archive names is present, has the size its descriptor
// states and the digest it is named by (a layer's uncompressed digest is its config's
// diff_id), and the archive carries at least one linux/amd64 image and a name a pod can
// refer to. The archive is untrusted input: JSON documents and what is kept in memory
// are bounded, and nothing is written. Pack writes the single-layer archives of
// hack/imagearchive.
//
// This package does not import images into containerd; the node's
// gpurack-images.service does that at boot.
package ociarchive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Limits on untrusted archives.
const (
	// MaxJSON bounds one JSON document (index, manifest, config) in an archive.
	MaxJSON = 4 << 20
	// maxKept bounds the bytes of small entries kept in memory while reading.
	maxKept = 64 << 20
	// maxEntries bounds the number of tar entries.
	maxEntries = 100000
	// maxDepth bounds nested indexes.
	maxDepth = 4
)

// Formats of an archive.
const (
	FormatDocker = "docker"
	FormatOCI    = "oci"
	// FormatBoth is an OCI layout that also has a docker manifest.json (Docker 25+).
	FormatBoth = "oci+docker"
)

// Archive is what Inspect found in an image archive.
type Archive struct {
	// Format is FormatDocker, FormatOCI or FormatBoth.
	Format string
	// Names are the image references the archive carries (docker RepoTags, the OCI
	// index's io.containerd.image.name and full org.opencontainers.image.ref.name
	// annotations), normalised as containerd and kubelet name them
	// (busybox → docker.io/library/busybox:latest), sorted, without duplicates.
	Names []string
	// Images is the number of linux/amd64 images, each checked complete.
	Images int
}

// File is an archive on disk: what Inspect found, and the file's digest and size.
type File struct {
	Archive
	Path string
	// SHA256 is the lowercase hex sha256 of the whole file.
	SHA256 string
	Size   int64
}

// InspectFile inspects the archive at path and digests it. Errors name the path.
func InspectFile(p string) (*File, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("image archive %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	cr := &countReader{r: io.TeeReader(f, h)}
	a, err := Inspect(cr)
	if err != nil {
		return nil, fmt.Errorf("image archive %s: %w", p, err)
	}
	// The digest covers the whole file, tar padding after the end marker included.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return nil, fmt.Errorf("image archive %s: %w", p, err)
	}
	return &File{Archive: *a, Path: p, SHA256: hex.EncodeToString(h.Sum(nil)), Size: cr.n}, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// entry is one regular file of the archive.
type entry struct {
	size   int64
	digest string // sha256 of the content, lowercase hex
	// plain is the sha256 of the gunzipped content of a gzip entry, else digest;
	// empty when the gzip stream is corrupt.
	plain string
	data  []byte // the content, when small enough to keep
}

// contents is the archive's files by cleaned path, and its links.
type contents struct {
	files map[string]*entry
	links map[string]string // path → target path (symlinks resolved to archive paths)
}

var gzipMagic = []byte{0x1f, 0x8b}

// Inspect reads an image archive (plain or gzip-compressed tar) from r and checks it
// (see the package comment). The error says what is wrong and where in the archive.
func Inspect(r io.Reader) (*Archive, error) {
	br := bufio.NewReader(r)
	if head, _ := br.Peek(2); bytes.Equal(head, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("not a gzip-compressed tar: %v", err)
		}
		zr.Multistream(false)
		c, err := readTar(zr)
		if err != nil {
			return nil, err
		}
		return c.check()
	}
	c, err := readTar(br)
	if err != nil {
		return nil, err
	}
	return c.check()
}

func readTar(r io.Reader) (*contents, error) {
	c := &contents{files: map[string]*entry{}, links: map[string]string{}}
	tr := tar.NewReader(r)
	kept := 0
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			if n == 0 {
				return nil, errors.New("is an empty tar: no index.json or manifest.json")
			}
			return c, nil
		}
		if err != nil {
			if n == 0 {
				return nil, fmt.Errorf("not a tar archive (%v); an image archive is what docker save or skopeo copy to oci-archive writes", err)
			}
			return nil, fmt.Errorf("corrupt or truncated tar after %d entries: %v", n, err)
		}
		if n >= maxEntries {
			return nil, fmt.Errorf("has more than %d entries; not an image archive", maxEntries)
		}
		name, ok := cleanName(hdr.Name)
		if !ok {
			return nil, fmt.Errorf("entry %q: the path leaves the archive", hdr.Name)
		}
		if _, dup := c.files[name]; dup {
			return nil, fmt.Errorf("entry %s appears twice", name)
		}
		if _, dup := c.links[name]; dup {
			return nil, fmt.Errorf("entry %s appears twice", name)
		}
		switch hdr.Typeflag {
		case tar.TypeReg: // the reader reports the old TypeRegA as TypeReg
			e, err := readEntry(tr, hdr.Size, &kept)
			if err != nil {
				return nil, fmt.Errorf("entry %s: %v", name, err)
			}
			c.files[name] = e
		case tar.TypeSymlink:
			target := hdr.Linkname
			if !strings.HasPrefix(target, "/") {
				target = path.Join(path.Dir(name), target)
			}
			t, ok := cleanName(target)
			if !ok {
				return nil, fmt.Errorf("entry %s: link to %q leaves the archive", name, hdr.Linkname)
			}
			c.links[name] = t
		case tar.TypeLink:
			t, ok := cleanName(hdr.Linkname)
			if !ok {
				return nil, fmt.Errorf("entry %s: link to %q leaves the archive", name, hdr.Linkname)
			}
			c.links[name] = t
		case tar.TypeDir, tar.TypeXGlobalHeader:
		default:
			return nil, fmt.Errorf("entry %s: type %q has no place in an image archive", name, hdr.Typeflag)
		}
	}
}

// cleanName returns the archive path of a tar name ("./blobs//x" → "blobs/x"), and
// false for a path outside the archive.
func cleanName(name string) (string, bool) {
	p := path.Clean("/" + name)
	if strings.Contains(name, "\x00") {
		return "", false
	}
	rel := strings.TrimPrefix(p, "/")
	// path.Clean of a rooted path cannot climb above the root, so ".." only stays
	// in the result if the name climbed out: compare the raw parts instead.
	depth := 0
	for _, part := range strings.Split(strings.TrimPrefix(name, "/"), "/") {
		switch part {
		case "..":
			depth--
		case "", ".":
		default:
			depth++
		}
		if depth < 0 {
			return "", false
		}
	}
	return rel, true
}

// readEntry digests one regular file, keeping it when it is small enough.
func readEntry(r io.Reader, size int64, kept *int) (*entry, error) {
	e := &entry{size: size}
	h := sha256.New()
	br := bufio.NewReader(io.TeeReader(r, h))
	// Peek's slice is the reader's buffer, which later reads overwrite: copy it.
	head, _ := br.Peek(2)
	head = bytes.Clone(head)
	var buf *bytes.Buffer
	if size <= MaxJSON && *kept+int(size) <= maxKept {
		buf = &bytes.Buffer{}
		*kept += int(size)
	}
	var src io.Reader = br
	if buf != nil {
		src = io.TeeReader(br, buf)
	}
	if bytes.Equal(head, gzipMagic) {
		ph := sha256.New()
		zr, err := gzip.NewReader(src)
		if err == nil {
			zr.Multistream(false)
			_, err = io.Copy(ph, zr)
		}
		if err == nil {
			e.plain = hex.EncodeToString(ph.Sum(nil))
		}
		// Whatever the gzip stream did, digest the rest of the entry.
	}
	if _, err := io.Copy(io.Discard, src); err != nil {
		return nil, err
	}
	e.digest = hex.EncodeToString(h.Sum(nil))
	if !bytes.Equal(head, gzipMagic) {
		e.plain = e.digest
	}
	if buf != nil {
		e.data = buf.Bytes()
	}
	return e, nil
}

// lookup returns the file at p, following up to 8 links.
func (c *contents) lookup(p string) (*entry, string, bool) {
	for range 8 {
		if e, ok := c.files[p]; ok {
			return e, p, true
		}
		t, ok := c.links[p]
		if !ok {
			return nil, p, false
		}
		p = t
	}
	return nil, p, false
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// check verifies the content-addressed blobs, then the OCI index and the docker
// manifest, whichever the archive has.
func (c *contents) check() (*Archive, error) {
	for _, name := range slices.Sorted(maps.Keys(c.files)) {
		if hexPart, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if !hexRE.MatchString(hexPart) {
				return nil, fmt.Errorf("blob %s is not named by a sha256 (64 lowercase hex digits)", name)
			}
			if got := c.files[name].digest; got != hexPart {
				return nil, fmt.Errorf("blob %s: its content has sha256 %s; the archive is corrupt", name, got)
			}
		}
	}
	a := &Archive{}
	names := map[string]bool{}
	_, _, hasIndex := c.lookup("index.json")
	_, _, hasManifest := c.lookup("manifest.json")
	switch {
	case hasIndex && hasManifest:
		a.Format = FormatBoth
	case hasIndex:
		a.Format = FormatOCI
	case hasManifest:
		a.Format = FormatDocker
	default:
		return nil, errors.New("has no index.json (OCI layout) or manifest.json (docker save) at its top; it is not an image archive")
	}
	amd64 := 0
	var platforms []string
	if hasIndex {
		n, ps, err := c.checkOCI(names)
		if err != nil {
			return nil, err
		}
		amd64, platforms = n, ps
	}
	if hasManifest {
		n, ps, err := c.checkDocker(names)
		if err != nil {
			return nil, err
		}
		// Docker 25+ lists the same images in both; count the larger view.
		amd64 = max(amd64, n)
		platforms = append(platforms, ps...)
	}
	if amd64 == 0 {
		slices.Sort(platforms)
		return nil, fmt.Errorf("has no linux/amd64 image (found %s); export the amd64 image (docker save --platform linux/amd64)", orNone(slices.Compact(platforms)))
	}
	if len(names) == 0 {
		return nil, errors.New("carries no image name (no RepoTags, no io.containerd.image.name), so no pod could refer to it; export it by name, for example docker save NAME:TAG")
	}
	a.Images = amd64
	a.Names = slices.Sorted(maps.Keys(names))
	return a, nil
}

func orNone(ps []string) string {
	if len(ps) == 0 {
		return "no image at all"
	}
	return strings.Join(ps, ", ")
}

// Media types of the OCI image spec v1.1 and of docker's registry manifest v2.
const (
	mtOCIIndex       = "application/vnd.oci.image.index.v1+json"
	mtOCIManifest    = "application/vnd.oci.image.manifest.v1+json"
	mtDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	mtDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
	} `json:"platform"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageManifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// readJSON decodes the kept file at p into v.
func (c *contents) readJSON(p, what string, v any) error {
	e, _, ok := c.lookup(p)
	if !ok {
		return fmt.Errorf("%s %s is not in the archive", what, p)
	}
	if e.data == nil {
		return fmt.Errorf("%s %s is %d bytes, more than the %d a JSON document in an image archive may have", what, p, e.size, MaxJSON)
	}
	if err := json.Unmarshal(e.data, v); err != nil {
		return fmt.Errorf("%s %s is not valid JSON: %v", what, p, err)
	}
	return nil
}

func (c *contents) checkOCI(names map[string]bool) (int, []string, error) {
	if _, _, ok := c.lookup("oci-layout"); ok {
		var layout struct {
			Version string `json:"imageLayoutVersion"`
		}
		if err := c.readJSON("oci-layout", "layout file", &layout); err != nil {
			return 0, nil, err
		}
		if layout.Version != "1.0.0" {
			return 0, nil, fmt.Errorf("oci-layout: imageLayoutVersion %q is not 1.0.0", layout.Version)
		}
	}
	var idx index
	if err := c.readJSON("index.json", "index", &idx); err != nil {
		return 0, nil, err
	}
	if idx.SchemaVersion != 2 {
		return 0, nil, fmt.Errorf("index.json: schemaVersion %d is not 2", idx.SchemaVersion)
	}
	for _, d := range idx.Manifests {
		if n := d.Annotations["io.containerd.image.name"]; n != "" {
			if err := addName(names, n, "index.json"); err != nil {
				return 0, nil, err
			}
		}
		// A bare tag ("latest") names nothing on its own; containerd uses only a
		// full reference here.
		if n := d.Annotations["org.opencontainers.image.ref.name"]; strings.Contains(n, "/") {
			if err := addName(names, n, "index.json"); err != nil {
				return 0, nil, err
			}
		}
	}
	w := &ociWalk{c: c}
	if err := w.descriptors("index.json", idx.Manifests, 0, false); err != nil {
		return 0, nil, err
	}
	return w.amd64, w.platforms, nil
}

type ociWalk struct {
	c         *contents
	amd64     int
	platforms []string
}

// descriptors checks the manifests an index lists. Inside a multi-platform index a
// manifest whose platform is not linux/amd64 may be absent (docker save --platform
// keeps only one); everything else must be there.
func (w *ociWalk) descriptors(where string, ds []descriptor, depth int, nested bool) error {
	if depth > maxDepth {
		return fmt.Errorf("%s: indexes nest more than %d deep", where, maxDepth)
	}
	for i, d := range ds {
		at := fmt.Sprintf("%s manifests[%d]", where, i)
		switch d.MediaType {
		case mtOCIIndex, mtDockerList, mtOCIManifest, mtDockerManifest:
		default:
			// Attestations and artifacts: not images, not imported as such.
			continue
		}
		otherPlatform := d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != "amd64")
		e, p, err := w.c.blob(at, d)
		if err != nil {
			if errors.Is(err, errAbsent) && nested && otherPlatform {
				w.platforms = append(w.platforms, d.Platform.OS+"/"+d.Platform.Architecture+" (not in the archive)")
				continue
			}
			return err
		}
		if e.data == nil {
			return fmt.Errorf("%s: %s is %d bytes, more than the %d a manifest may have", at, p, e.size, MaxJSON)
		}
		switch d.MediaType {
		case mtOCIIndex, mtDockerList:
			var sub index
			if err := json.Unmarshal(e.data, &sub); err != nil {
				return fmt.Errorf("%s: index %s is not valid JSON: %v", at, p, err)
			}
			if err := w.descriptors(p, sub.Manifests, depth+1, true); err != nil {
				return err
			}
		default:
			if err := w.manifest(p, e.data); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *ociWalk) manifest(p string, data []byte) error {
	var m imageManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("manifest %s is not valid JSON: %v", p, err)
	}
	ce, cp, err := w.c.blob("manifest "+p+" config", m.Config)
	if err != nil {
		return err
	}
	cfg, err := parseConfig(cp, ce)
	if err != nil {
		return err
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("manifest %s lists %d layers but its config %s has %d diff_ids", p, len(m.Layers), cp, len(cfg.RootFS.DiffIDs))
	}
	for i, l := range m.Layers {
		le, lp, err := w.c.blob(fmt.Sprintf("manifest %s layers[%d]", p, i), l)
		if err != nil {
			return err
		}
		if strings.HasSuffix(l.MediaType, "+zstd") {
			// The blob digest is checked; zstd is not in Go's standard library,
			// so the diff_id is left to containerd.
			continue
		}
		if err := checkDiffID(lp, le, cfg.RootFS.DiffIDs[i]); err != nil {
			return err
		}
	}
	w.count(cfg)
	return nil
}

func (w *ociWalk) count(cfg *imageConfig) {
	if cfg.OS == "linux" && cfg.Architecture == "amd64" {
		w.amd64++
		return
	}
	w.platforms = append(w.platforms, cfg.OS+"/"+cfg.Architecture)
}

var errAbsent = errors.New("not in the archive")

// blob returns the blob a descriptor names, checking its size (its digest was
// checked with every blob).
func (c *contents) blob(at string, d descriptor) (*entry, string, error) {
	alg, hexPart, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" || !hexRE.MatchString(hexPart) {
		return nil, "", fmt.Errorf("%s: digest %q is not sha256:HEX (the only algorithm gpurack reads)", at, d.Digest)
	}
	p := "blobs/sha256/" + hexPart
	e, _, found := c.lookup(p)
	if !found {
		return nil, p, fmt.Errorf("%s: %s is %w", at, p, errAbsent)
	}
	if e.size != d.Size {
		return nil, p, fmt.Errorf("%s: %s is %d bytes but its descriptor says %d; the archive is corrupt", at, p, e.size, d.Size)
	}
	return e, p, nil
}

func parseConfig(p string, e *entry) (*imageConfig, error) {
	if e.data == nil {
		return nil, fmt.Errorf("image config %s is %d bytes, more than the %d a config may have", p, e.size, MaxJSON)
	}
	var cfg imageConfig
	if err := json.Unmarshal(e.data, &cfg); err != nil {
		return nil, fmt.Errorf("image config %s is not valid JSON: %v", p, err)
	}
	return &cfg, nil
}

func checkDiffID(p string, e *entry, diffID string) error {
	want, ok := strings.CutPrefix(diffID, "sha256:")
	if !ok || !hexRE.MatchString(want) {
		return fmt.Errorf("layer %s: its config's diff_id %q is not sha256:HEX", p, diffID)
	}
	if e.plain == "" {
		return fmt.Errorf("layer %s: corrupt gzip stream", p)
	}
	if e.plain != want {
		return fmt.Errorf("layer %s: its content has sha256 %s but the image config says %s (layer digest mismatch; the archive is corrupt)", p, e.plain, diffID)
	}
	return nil
}

type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

func (c *contents) checkDocker(names map[string]bool) (int, []string, error) {
	var ms []dockerManifest
	if err := c.readJSON("manifest.json", "docker manifest", &ms); err != nil {
		return 0, nil, err
	}
	amd64 := 0
	var platforms []string
	for i, m := range ms {
		at := fmt.Sprintf("manifest.json [%d]", i)
		cp, ok := cleanName(m.Config)
		if m.Config == "" || !ok {
			return 0, nil, fmt.Errorf("%s: Config %q is not a path in the archive", at, m.Config)
		}
		ce, _, found := c.lookup(cp)
		if !found {
			return 0, nil, fmt.Errorf("%s: config %s is not in the archive", at, cp)
		}
		// A legacy config is named HEX.json after its digest.
		if stem, ok := strings.CutSuffix(path.Base(cp), ".json"); ok && hexRE.MatchString(stem) && ce.digest != stem {
			return 0, nil, fmt.Errorf("%s: config %s has sha256 %s; the archive is corrupt", at, cp, ce.digest)
		}
		cfg, err := parseConfig(cp, ce)
		if err != nil {
			return 0, nil, err
		}
		if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
			return 0, nil, fmt.Errorf("%s lists %d layers but its config %s has %d diff_ids", at, len(m.Layers), cp, len(cfg.RootFS.DiffIDs))
		}
		for j, l := range m.Layers {
			lp, ok := cleanName(l)
			if l == "" || !ok {
				return 0, nil, fmt.Errorf("%s: Layers[%d] %q is not a path in the archive", at, j, l)
			}
			le, _, found := c.lookup(lp)
			if !found {
				return 0, nil, fmt.Errorf("%s: layer %s is not in the archive", at, lp)
			}
			if err := checkDiffID(lp, le, cfg.RootFS.DiffIDs[j]); err != nil {
				return 0, nil, err
			}
		}
		for _, t := range m.RepoTags {
			if err := addName(names, t, at+" RepoTags"); err != nil {
				return 0, nil, err
			}
		}
		if cfg.OS == "linux" && cfg.Architecture == "amd64" {
			amd64++
		} else {
			platforms = append(platforms, cfg.OS+"/"+cfg.Architecture)
		}
	}
	return amd64, platforms, nil
}

func addName(names map[string]bool, ref, where string) error {
	n, err := Normalize(ref)
	if err != nil {
		return fmt.Errorf("%s: %v", where, err)
	}
	names[n] = true
	return nil
}

// referenceRE is a docker image reference: [host[:port]/]path[:tag][@sha256:hex],
// path components lowercase (distribution's reference grammar, simplified).
var referenceRE = regexp.MustCompile(`^` +
	`(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?` +
	`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
	`(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?` +
	`(?:@sha256:[0-9a-f]{64})?$`)

// Normalize returns ref as containerd's CRI and kubelet name it: a registry host
// (docker.io when the first component is not a host), library/ for a single docker.io
// component, and the tag latest when neither tag nor digest is given.
func Normalize(ref string) (string, error) {
	if len(ref) > 255 || !referenceRE.MatchString(ref) {
		return "", fmt.Errorf("%q is not an image reference like registry.example/team/image:tag", ref)
	}
	first, rest, hasSlash := strings.Cut(ref, "/")
	isHost := hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost")
	if hasSlash && !isHost && first != strings.ToLower(first) {
		// Not a host, so a path component, which is lowercase.
		return "", fmt.Errorf("%q is not an image reference like registry.example/team/image:tag", ref)
	}
	if !isHost {
		if !hasSlash {
			ref = "docker.io/library/" + ref
		} else {
			ref = "docker.io/" + ref
		}
	} else if first == "docker.io" && !strings.Contains(rest, "/") {
		ref = "docker.io/library/" + rest
	}
	if strings.Contains(ref, "@") {
		return ref, nil
	}
	if !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":") {
		ref += ":latest"
	}
	return ref, nil
}

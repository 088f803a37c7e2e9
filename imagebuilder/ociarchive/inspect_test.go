package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

var goldenBinary = []byte("#!/bin/true\nhello gpurack\n")

// goldenPack is the sha256 of Pack("probebin", goldenBinary, "example.test/golden:1"),
// recorded from hack/imagearchive before its packer moved here: the pause image and
// every archive packed since keep their bytes.
const goldenPack = "e3e6f47ff4e370b4989fb55eff0a5a3abadd288e2c4a53502824d5dead8df92e"

func TestPackIsReproducible(t *testing.T) {
	a, err := Pack("probebin", goldenBinary, "example.test/golden:1")
	if err != nil {
		t.Fatal(err)
	}
	if got := hexDigest(a); got != goldenPack {
		t.Errorf("Pack gives sha256 %s, want the golden %s", got, goldenPack)
	}
	b, _ := Pack("probebin", goldenBinary, "example.test/golden:1")
	if !bytes.Equal(a, b) {
		t.Error("two packs of the same binary differ")
	}
	c, _ := Pack("probebin", append(slices.Clone(goldenBinary), '!'), "example.test/golden:1")
	if bytes.Equal(a, c) {
		t.Error("a changed binary gives the same archive")
	}
	for _, bad := range []struct{ name, tag string }{{"", "x:1"}, {"a/b", "x:1"}, {"..", "x:1"}, {"probe", ""}} {
		if _, err := Pack(bad.name, goldenBinary, bad.tag); err == nil {
			t.Errorf("Pack(%q, %q) accepted", bad.name, bad.tag)
		}
	}
}

// TestPackAsUser checks that PackAs writes the user into the image config (the debug
// image runs as root) and refuses a user that is not UID:GID.
func TestPackAsUser(t *testing.T) {
	a, err := PackAs("probebin", goldenBinary, "example.test/golden:1", "0:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(a))
	var config map[string]any
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no image config in the archive: %v", err)
		}
		if strings.HasSuffix(h.Name, ".json") && h.Name != "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&config); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if u := config["config"].(map[string]any)["User"]; u != "0:0" {
		t.Errorf("config User = %v, want 0:0", u)
	}
	for _, bad := range []string{"", "root", "0", "0:", ":0", "-1:0", "0:0:0", "99999999999:0"} {
		if _, err := PackAs("probebin", goldenBinary, "example.test/golden:1", bad); err == nil {
			t.Errorf("PackAs with user %q accepted", bad)
		}
	}
}

func TestInspectPacked(t *testing.T) {
	data, err := Pack("probebin", goldenBinary, "example.test/golden:1")
	if err != nil {
		t.Fatal(err)
	}
	a, err := Inspect(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if a.Format != FormatDocker || a.Images != 1 || !slices.Equal(a.Names, []string{"example.test/golden:1"}) {
		t.Errorf("Inspect = %+v", a)
	}
	// gzip-compressed, as `docker save | gzip` writes it, is read too.
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(data)
	zw.Close()
	if _, err := Inspect(&z); err != nil {
		t.Errorf("gzip-compressed archive: %v", err)
	}
}

// TestInspectPauseArchive reads the pause archive that make k8s-bins packs with
// hack/imagearchive, the one every image ships today.
func TestInspectPauseArchive(t *testing.T) {
	dir := os.Getenv("GPURACK_K8S_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "gpurack", "k8s", "v1.34.2")
	}
	p := filepath.Join(dir, "images", "pause.tar")
	testreq.File(t, p, "make k8s-bins")
	f, err := InspectFile(p)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	sum := sha256.Sum256(raw)
	if f.SHA256 != hex.EncodeToString(sum[:]) || f.Size != int64(len(raw)) {
		t.Errorf("InspectFile digest %s size %d, want %x %d", f.SHA256, f.Size, sum, len(raw))
	}
	if len(f.Names) != 1 || !strings.Contains(f.Names[0], "pause") {
		t.Errorf("names %v", f.Names)
	}
}

func TestInspectFileErrorsNamePath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.tar")
	if _, err := InspectFile(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	junk := filepath.Join(dir, "junk.tar")
	os.WriteFile(junk, bytes.Repeat([]byte("not a tar "), 100), 0o644)
	_, err := InspectFile(junk)
	if err == nil || !strings.Contains(err.Error(), junk) || !strings.Contains(err.Error(), "not a tar archive") {
		t.Errorf("junk file: %v", err)
	}
}

// tarOf writes files (in the given order) as a tar.
func tarOf(t testing.TB, files ...tarFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(f.data)
	}
	tw.Close()
	return buf.Bytes()
}

// dockerParts returns the files of a packed single-image docker archive, in order.
func dockerParts(t testing.TB) []tarFile {
	t.Helper()
	data, err := Pack("probebin", goldenBinary, "example.test/golden:1")
	if err != nil {
		t.Fatal(err)
	}
	var files []tarFile
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var b bytes.Buffer
		b.ReadFrom(tr)
		files = append(files, tarFile{h.Name, 0o644, b.Bytes()})
	}
	return files
}

func TestInspectDockerCorrupt(t *testing.T) {
	edit := func(f func([]tarFile) []tarFile) []byte {
		return tarOf(t, f(dockerParts(t))...)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not a tar", []byte("hello, this is not a tar archive at all, it is text " + strings.Repeat(".", 600)), "not a tar archive"},
		{"empty", nil, "empty tar"},
		{"empty tar", tarOf(t), "empty tar"},
		{"no manifest", tarOf(t, tarFile{"hello.txt", 0, []byte("hi")}), "no index.json"},
		{"manifest not json", edit(func(fs []tarFile) []tarFile { fs[2].data = []byte("{nope"); return fs }), "manifest.json is not valid JSON"},
		{"config missing", edit(func(fs []tarFile) []tarFile { return fs[1:] }), "config 1b99df0f013a3e4fb02819fb15b75b483552f0389a586d00782e1339d225007a.json is not in the archive"},
		{"layer missing", edit(func(fs []tarFile) []tarFile { return []tarFile{fs[0], fs[2]} }), "/layer.tar is not in the archive"},
		{"layer corrupt", edit(func(fs []tarFile) []tarFile {
			fs[1].data = slices.Clone(fs[1].data)
			fs[1].data[600] ^= 1
			return fs
		}), "layer digest mismatch"},
		{"config corrupt", edit(func(fs []tarFile) []tarFile {
			fs[0].data = bytes.Replace(fs[0].data, []byte("65535:65535"), []byte("0:0"), 1)
			return fs
		}), "has sha256"},
		{"duplicate entry", edit(func(fs []tarFile) []tarFile { return append(fs, fs[2]) }), "appears twice"},
		{"truncated", func() []byte { d := edit(func(fs []tarFile) []tarFile { return fs }); return d[:1200] }(), "corrupt or truncated tar"},
		{"climbs out", tarOf(t, tarFile{"../manifest.json", 0, []byte("[]")}), "leaves the archive"},
		{"no image", tarOf(t, tarFile{"manifest.json", 0, []byte("[]")}), "no linux/amd64 image"},
		{"no name", edit(func(fs []tarFile) []tarFile {
			fs[2].data = bytes.Replace(fs[2].data, []byte(`["example.test/golden:1"]`), []byte(`null`), 1)
			return fs
		}), "carries no image name"},
		{"bad name", edit(func(fs []tarFile) []tarFile {
			fs[2].data = bytes.Replace(fs[2].data, []byte(`example.test/golden:1`), []byte(`Example.test/GOLDEN`), 1)
			return fs
		}), "is not an image reference"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Inspect(bytes.NewReader(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Inspect: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// ociImage is an OCI layout tar of one or more images, written by the test.
type ociImage struct {
	arch     string
	gzip     bool
	layer    []byte
	annotate map[string]string
}

func blobFile(b []byte) (tarFile, descriptorJSON) {
	d := hexDigest(b)
	return tarFile{"blobs/sha256/" + d, 0, b}, descriptorJSON{Digest: "sha256:" + d, Size: int64(len(b))}
}

type descriptorJSON struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// ociFiles returns the blobs of one image and its manifest descriptor.
func ociFiles(t testing.TB, img ociImage) ([]tarFile, descriptorJSON) {
	layerTar := tarOf(t, tarFile{"probe", 0, img.layer})
	layer := layerTar
	mt := "application/vnd.oci.image.layer.v1.tar"
	if img.gzip {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(layerTar)
		zw.Close()
		layer, mt = z.Bytes(), mt+"+gzip"
	}
	lf, ld := blobFile(layer)
	ld.MediaType = mt
	cfg := mustJSON(map[string]any{"architecture": img.arch, "os": "linux", "rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hexDigest(layerTar)}}})
	cf, cd := blobFile(cfg)
	cd.MediaType = "application/vnd.oci.image.config.v1+json"
	man := mustJSON(map[string]any{"schemaVersion": 2, "mediaType": mtOCIManifest, "config": cd, "layers": []descriptorJSON{ld}})
	mf, md := blobFile(man)
	md.MediaType = mtOCIManifest
	md.Annotations = img.annotate
	md.Platform = map[string]string{"os": "linux", "architecture": img.arch}
	return []tarFile{lf, cf, mf}, md
}

func ociLayout(t testing.TB, files []tarFile, top ...descriptorJSON) []byte {
	idx := mustJSON(map[string]any{"schemaVersion": 2, "mediaType": mtOCIIndex, "manifests": top})
	files = append(files, tarFile{"oci-layout", 0, []byte(`{"imageLayoutVersion":"1.0.0"}`)}, tarFile{"index.json", 0, idx})
	return tarOf(t, files...)
}

var named = map[string]string{"io.containerd.image.name": "example.test/probe:v1", "org.opencontainers.image.ref.name": "v1"}

func TestInspectOCI(t *testing.T) {
	amd, amdDesc := ociFiles(t, ociImage{arch: "amd64", gzip: true, layer: []byte("amd64 probe"), annotate: named})
	a, err := Inspect(bytes.NewReader(ociLayout(t, amd, amdDesc)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Format != FormatOCI || a.Images != 1 || !slices.Equal(a.Names, []string{"example.test/probe:v1"}) {
		t.Errorf("Inspect = %+v", a)
	}

	// A multi-platform index whose arm64 manifest was left out (docker save
	// --platform): fine, the amd64 one is complete.
	arm, armDesc := ociFiles(t, ociImage{arch: "arm64", layer: []byte("arm64 probe")})
	amdPlain, amdPlainDesc := ociFiles(t, ociImage{arch: "amd64", layer: []byte("amd64 probe")})
	list := mustJSON(map[string]any{"schemaVersion": 2, "mediaType": mtOCIIndex, "manifests": []descriptorJSON{amdPlainDesc, armDesc}})
	lf, ld := blobFile(list)
	ld.MediaType = mtOCIIndex
	ld.Annotations = named
	a, err = Inspect(bytes.NewReader(ociLayout(t, append(amdPlain, lf), ld)))
	if err != nil || a.Images != 1 {
		t.Errorf("multi-platform index without its arm64 manifest: %+v %v", a, err)
	}

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"arm64 only", ociLayout(t, arm, func() descriptorJSON { d := armDesc; d.Annotations = named; return d }()), "no linux/amd64 image (found linux/arm64)"},
		{"amd64 manifest missing from the index", ociLayout(t, append(arm, lf), ld), "is not in the archive"},
		{"manifest missing", ociLayout(t, amd[:2], amdDesc), "is not in the archive"},
		{"layer missing", ociLayout(t, amd[1:], amdDesc), "layers[0]: blobs/sha256/"},
		{"size mismatch", ociLayout(t, amd, func() descriptorJSON { d := amdDesc; d.Size++; return d }()), "but its descriptor says"},
		{"blob corrupt", ociLayout(t, func() []tarFile {
			fs := slices.Clone(amd)
			fs[0].data = slices.Clone(fs[0].data)
			fs[0].data[len(fs[0].data)/2] ^= 0xff
			return fs
		}(), amdDesc), "its content has sha256"},
		{"bare tag only", ociLayout(t, amd, func() descriptorJSON {
			d := amdDesc
			d.Annotations = map[string]string{"org.opencontainers.image.ref.name": "latest"}
			return d
		}()), "carries no image name"},
		{"bad digest", ociLayout(t, amd, func() descriptorJSON { d := amdDesc; d.Digest = "md5:abc"; return d }()), "is not sha256:HEX"},
		{"bad layout", tarOf(t, tarFile{"oci-layout", 0, []byte(`{"imageLayoutVersion":"9"}`)}, tarFile{"index.json", 0, []byte(`{"schemaVersion":2}`)}), "imageLayoutVersion"},
		{"bad index", tarOf(t, tarFile{"index.json", 0, []byte(`{"schemaVersion":1}`)}), "schemaVersion 1 is not 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Inspect(bytes.NewReader(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Inspect: %v, want an error containing %q", err, c.want)
			}
		})
	}

	// A diff_id that does not match the gunzipped layer.
	bad := slices.Clone(amd)
	var cfg map[string]any
	json.Unmarshal(bad[1].data, &cfg)
	cfg["rootfs"] = map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + strings.Repeat("0", 64)}}
	cf, cd := blobFile(mustJSON(cfg))
	cd.MediaType = "application/vnd.oci.image.config.v1+json"
	var man map[string]any
	json.Unmarshal(bad[2].data, &man)
	man["config"] = cd
	mf, md := blobFile(mustJSON(man))
	md.MediaType = mtOCIManifest
	md.Annotations = named
	_, err = Inspect(bytes.NewReader(ociLayout(t, []tarFile{bad[0], cf, mf}, md)))
	if err == nil || !strings.Contains(err.Error(), "layer digest mismatch") {
		t.Errorf("diff_id mismatch: %v", err)
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                      "docker.io/library/busybox:latest",
		"busybox:1.36":                 "docker.io/library/busybox:1.36",
		"team/app":                     "docker.io/team/app:latest",
		"docker.io/busybox":            "docker.io/library/busybox:latest",
		"registry.k8s.io/pause:3.10.1": "registry.k8s.io/pause:3.10.1",
		"localhost/probe":              "localhost/probe:latest",
		"host:5000/a/b:c":              "host:5000/a/b:c",
		"gpurack.io/probe@sha256:" + strings.Repeat("a", 64): "gpurack.io/probe@sha256:" + strings.Repeat("a", 64),
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "UPPER/case", "a b", "a:", ":tag", "a/../b", "x@sha256:short"} {
		if _, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) accepted", bad)
		}
	}
}

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{"./index.json": "index.json", "blobs//sha256/x": "blobs/sha256/x", "/manifest.json": "manifest.json", "a/../b": "b"} {
		if got, ok := cleanName(in); !ok || got != want {
			t.Errorf("cleanName(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, bad := range []string{"../x", "a/../../x", "x\x00y"} {
		if _, ok := cleanName(bad); ok {
			t.Errorf("cleanName(%q) accepted", bad)
		}
	}
}

func ExamplePack() {
	data, _ := Pack("probe", []byte("a static binary"), "gpurack.io/probe:v1")
	a, _ := Inspect(bytes.NewReader(data))
	fmt.Println(a.Format, a.Names, a.Images)
	// Output: docker [gpurack.io/probe:v1] 1
}

// TestInspectLargeGzipLayer: a gzip layer larger than the read buffer is recognised as
// gzip all the way through (the gzip check once read a buffer that had been refilled,
// and took a good workload image's layer for corrupt).
func TestInspectLargeGzipLayer(t *testing.T) {
	// Incompressible and over MaxJSON, so that the layer is read straight from the
	// buffered reader (not kept), many buffers long.
	big := make([]byte, MaxJSON+1<<20)
	rand.NewChaCha8([32]byte{1}).Read(big)
	files, desc := ociFiles(t, ociImage{arch: "amd64", gzip: true, layer: big, annotate: named})
	a, err := Inspect(bytes.NewReader(ociLayout(t, files, desc)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Images != 1 {
		t.Fatalf("Inspect = %+v", a)
	}
}

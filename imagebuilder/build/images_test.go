package build

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

// writeArchive packs binary as a one-layer image tagged tag into dir/name.
func writeArchive(t *testing.T, dir, name string, binary []byte, tag string) {
	t.Helper()
	data, err := ociarchive.Pack("probe", binary, tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestImageArchives(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "images"), 0o755)
	writeArchive(t, filepath.Join(dir, "images"), "probe.tar", []byte("probe v1"), "gpurack.io/probe:v1")
	profilePath := filepath.Join(dir, "p.yaml")
	p := &profile.Profile{Images: []profile.ImageArchive{{Path: "images/probe.tar", Name: "gpurack.io/probe:v1"}}}

	fs, err := ImageArchives(profilePath, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Names[0] != "gpurack.io/probe:v1" || fs[0].Path != filepath.Join(dir, "images/probe.tar") {
		t.Fatalf("ImageArchives = %+v", fs)
	}
	m := manifestArchives(fs)
	if m[0].Path != manifest.ImagesDir+"/"+fs[0].SHA256+".tar" || m[0].SHA256 != fs[0].SHA256 || m[0].Size != fs[0].Size {
		t.Errorf("manifest entry %+v", m[0])
	}

	// The image id follows the archive's content: rebuild the archive from another
	// binary under the same path and name, and the id changes.
	id := func() string {
		fs, err := ImageArchives(profilePath, p)
		if err != nil {
			t.Fatal(err)
		}
		return manifest.ImageID(p.Canonical(), []byte("lock"), "builder", map[string]string{"gpuagent": "a"}, archiveDigests(fs))
	}
	before := id()
	if again := id(); again != before {
		t.Errorf("the same archive gives ids %s and %s", before, again)
	}
	writeArchive(t, filepath.Join(dir, "images"), "probe.tar", []byte("probe v2"), "gpurack.io/probe:v1")
	if after := id(); after == before {
		t.Errorf("a changed archive keeps the image id %s", before)
	}
	if none := manifest.ImageID(p.Canonical(), []byte("lock"), "builder", map[string]string{"gpuagent": "a"}, nil); none == before {
		t.Error("an image without archives has the id of one with them")
	}

	// Failures name the profile field, the file and the reason.
	os.WriteFile(filepath.Join(dir, "images", "junk.tar"), []byte(strings.Repeat("junk", 300)), 0o644)
	writeArchive(t, dir, "other.tar", []byte("x"), "example.test/other:1")
	cases := []struct {
		im   profile.ImageArchive
		want []string
	}{
		{profile.ImageArchive{Path: "images/missing.tar"}, []string{"images[0]", filepath.Join(dir, "images/missing.tar"), "no such file"}},
		{profile.ImageArchive{Path: "images/junk.tar"}, []string{"images[0]", "junk.tar", "not a tar archive"}},
		{profile.ImageArchive{Path: "other.tar", Name: "gpurack.io/probe:v1"}, []string{"images[0]", "does not carry gpurack.io/probe:v1", "example.test/other:1"}},
	}
	for _, c := range cases {
		_, err := ImageArchives(profilePath, &profile.Profile{Images: []profile.ImageArchive{c.im}})
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to contain %q", c.im.Path, err, w)
			}
		}
	}
	_, err = ImageArchives(profilePath, &profile.Profile{Images: []profile.ImageArchive{{Path: "other.tar"}, {Path: filepath.Join(dir, "other.tar")}}})
	if err == nil || !strings.Contains(err.Error(), "same content as images[0]") {
		t.Errorf("the same archive twice: %v", err)
	}
}

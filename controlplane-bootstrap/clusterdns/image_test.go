package clusterdns_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestVersionIsThePinnedCoreDNS keeps clusterdns.Version (and so the image the
// Deployment runs) equal to the CoreDNS images/coredns/go.mod pins, which is the
// tag hack/coredns-image.sh gives the archive.
func TestVersionIsThePinnedCoreDNS(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "images", "coredns", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := "github.com/coredns/coredns " + clusterdns.Version + "\n"
	if !strings.Contains(string(data), want) {
		t.Errorf("images/coredns/go.mod does not require %q: change clusterdns.Version with the pin\n%s", strings.TrimSpace(want), data)
	}
}

// TestCoreDNSImageIsReproducible builds the CoreDNS image twice the way make
// coredns-image does and checks that the archives are the same bytes, a complete
// image, and named exactly clusterdns.Image.
func TestCoreDNSImageIsReproducible(t *testing.T) {
	testreq.Short(t, "builds CoreDNS twice")
	testreq.Tool(t, "go", "install Go")
	dir := t.TempDir()
	var sums []string
	for _, name := range []string{"a.tar", "b.tar"} {
		out := filepath.Join(dir, name)
		cmd := exec.Command(filepath.Join("..", "..", "hack", "coredns-image.sh"), out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("hack/coredns-image.sh: %v\n%s", err, b)
		}
		f, err := ociarchive.InspectFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.Names, []string{clusterdns.Image}) || f.Images != 1 {
			t.Errorf("coredns archive names %v, %d images; want [%s], 1", f.Names, f.Images, clusterdns.Image)
		}
		sums = append(sums, f.SHA256)
	}
	if sums[0] != sums[1] {
		t.Errorf("two builds of the CoreDNS image differ: %s and %s", sums[0], sums[1])
	}
	t.Logf("%s: sha256 %s", clusterdns.Image, sums[0])
}

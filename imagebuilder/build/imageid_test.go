package build

import (
	"testing"

	"github.com/gpurack/gpurack/internal/manifest"
)

// TestUnitNamesTheImage: the gpuagent unit ships in the image like the binaries, so two
// builds that differ only in the unit get different image ids, and the same unit the
// same id.
func TestUnitNamesTheImage(t *testing.T) {
	bins := map[string]manifest.FileDigest{"gpuagent": {SHA256: "aa"}, "kubelet": {SHA256: "bb"}}
	id := func(unit string) string {
		return manifest.ImageID([]byte("profile"), []byte("lock"), "builder", bundledDigests(bins, []byte(unit)), nil)
	}
	a := id("[Service]\nExecStart=/usr/bin/gpuagent run\n")
	if b := id("[Service]\nExecStart=/usr/bin/gpuagent run --interval 1s\n"); a == b {
		t.Fatalf("two units give the same image id %s", a)
	}
	if b := id("[Service]\nExecStart=/usr/bin/gpuagent run\n"); a != b {
		t.Fatalf("the same unit gives ids %s and %s", a, b)
	}
	if d := bundledDigests(bins, nil); d["gpuagent"] != "aa" || d["kubelet"] != "bb" || len(d) != 3 {
		t.Fatalf("bundled digests = %v, want the binaries and the unit", d)
	}
}

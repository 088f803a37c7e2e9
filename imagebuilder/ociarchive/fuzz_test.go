package ociarchive

import (
	"bytes"
	"testing"
)

// FuzzInspect feeds arbitrary bytes to the archive parser, which reads archives a user
// hands to gpuimage: it must not panic, and what it accepts must be an image a pod
// can use (an amd64 image and a name).
func FuzzInspect(f *testing.F) {
	packed, err := Pack("probebin", goldenBinary, "example.test/golden:1")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(packed)
	amd, amdDesc := ociFiles(f, ociImage{arch: "amd64", gzip: true, layer: []byte("amd64 probe"), annotate: named})
	f.Add(ociLayout(f, amd, amdDesc))
	f.Add(tarOf(f, tarFile{"index.json", 0, []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:00","size":1}]}`)}))
	f.Add([]byte{0x1f, 0x8b, 0x08})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Inspect(bytes.NewReader(data))
		if err != nil {
			return
		}
		if a.Images < 1 || len(a.Names) == 0 {
			t.Fatalf("accepted an archive without an amd64 image or a name: %+v", a)
		}
		for _, n := range a.Names {
			if again, err := Normalize(n); err != nil || again != n {
				t.Fatalf("name %q does not normalise to itself: %q %v", n, again, err)
			}
		}
	})
}

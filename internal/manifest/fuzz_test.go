package manifest

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and whatever
// it accepts must re-marshal, re-parse to an equal manifest, and marshal to
// the same canonical bytes again.
func FuzzParse(f *testing.F) {
	good, err := Marshal(testManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	m := testManifest()
	m.Driver = nil
	noGPU, err := Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(noGPU)
	f.Fuzz(func(t *testing.T, data []byte) {
		m1, err := Parse(data)
		if err != nil {
			if m1 != nil {
				t.Fatalf("Parse returned a manifest with an error")
			}
			return
		}
		out1, err := Marshal(m1)
		if err != nil {
			t.Fatalf("Parse accepted what Marshal refuses: %v\ninput: %q", err, data)
		}
		m2, err := Parse(out1)
		if err != nil {
			t.Fatalf("Parse refuses Marshal's output: %v\n%s", err, out1)
		}
		if !reflect.DeepEqual(m1, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m1, m2)
		}
		out2, err := Marshal(m2)
		if err != nil || !bytes.Equal(out1, out2) {
			t.Fatalf("Marshal is not stable across a round trip: %v\n%s\n%s", err, out1, out2)
		}
	})
}

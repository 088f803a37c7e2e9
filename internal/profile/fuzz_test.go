package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the profile parser: it must never panic, every
// error must be located in the file, and an accepted profile must re-validate from its
// canonical form.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("../../profiles/*.yaml")
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(nvidia))
	f.Add([]byte(tiny))
	f.Add([]byte(strings.Replace(nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw: [48, 79, 92]", 1)))
	f.Add([]byte(strings.Replace(nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing:\n      replicas: 4", 1)))
	f.Add([]byte(strings.Replace(tiny, "kubernetes:", "images:\n  - path: images/probe.tar\n    name: gpurack.io/probe:v1\nkubernetes:", 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		// Canonical JSON is YAML; it must parse back to the same digest.
		q, err := Parse("f.json", p.Canonical())
		if err != nil {
			t.Fatalf("canonical form of an accepted profile is rejected: %v\n%s", err, p.Canonical())
		}
		if q.Digest() != p.Digest() {
			t.Fatalf("digest changed through the canonical form")
		}
	})
}

// FuzzParseLock: the lock parser never panics and locates its errors.
func FuzzParseLock(f *testing.F) {
	good, _ := sampleLock().Marshal()
	f.Add(good)
	f.Add([]byte(`{"schemaVersion": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLock("f.lock.json", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.lock.json") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		b, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseLock("again.lock.json", b); err != nil {
			t.Fatalf("an accepted lock does not survive Marshal: %v", err)
		}
	})
}

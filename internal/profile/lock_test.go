package profile

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func sampleLock() *Lock {
	sum := strings.Repeat("ab", 32)
	return &Lock{
		Profile:       "tiny",
		ProfileDigest: "sha256:" + sum,
		Release:       []Release{{Suite: "bookworm", Archive: "Debian", Digest: "sha256:" + sum, Date: "Sat, 08 Nov 2025 10:00:00 UTC"}},
		Packages: []LockedPackage{
			{Name: "systemd", Version: "252.39-1~deb12u1", Architecture: "amd64", Area: "main", Filename: "pool/main/s/systemd/systemd_252.39-1~deb12u1_amd64.deb", Size: 3000000, SHA256: sum},
			{Name: "base-files", Version: "12.4+deb12u12", Architecture: "amd64", Area: "main", Filename: "pool/main/b/base-files/base-files_12.4+deb12u12_amd64.deb", Size: 70000, SHA256: sum},
		},
		Build: []LockedPackage{
			{Name: "linux-kbuild-6.1", Version: "6.1.176-1", Architecture: "amd64", Area: "main", Filename: "pool/main/l/linux/linux-kbuild-6.1_6.1.176-1_amd64.deb", Size: 1, SHA256: sum},
		},
	}
}

func TestLockRoundTripIsCanonical(t *testing.T) {
	l := sampleLock()
	b1, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseLock("tiny.lock.json", b1)
	if err != nil {
		t.Fatalf("a marshalled lock does not parse:\n%v\n%s", err, b1)
	}
	if parsed.Packages[0].Name != "base-files" {
		t.Errorf("packages not sorted: first is %q", parsed.Packages[0].Name)
	}
	b2, _ := parsed.Marshal()
	if !bytes.Equal(b1, b2) {
		t.Errorf("marshal is not stable:\n%s\n---\n%s", b1, b2)
	}
	if parsed.Find("systemd") == nil || parsed.Find("nope") != nil {
		t.Error("Find does not find by name")
	}
	if got := LockPath("profiles/tiny.yaml"); got != "profiles/tiny.lock.json" {
		t.Errorf("LockPath = %q", got)
	}
}

func TestLockErrors(t *testing.T) {
	good, _ := sampleLock().Marshal()
	cases := []struct {
		name, old, new, field, text string
	}{
		{"unknown field", `"profile": "tiny",`, `"profile": "tiny", "extra": 1,`, "extra", "unknown field"},
		{"bad sha", `"sha256": "` + strings.Repeat("ab", 32) + `"`, `"sha256": "XYZ"`, "packages[0].sha256", "64 lowercase hex"},
		{"bad area", `"area": "main"`, `"area": "universe"`, "packages[0].area", "unknown archive area"},
		{"path escape", `"filename": "pool/main/b`, `"filename": "../../b`, "packages[0].filename", "without .."},
		{"bad size type", `"size": 70000`, `"size": "big"`, "packages[0].size", "whole number"},
		{"schema", `"schemaVersion": 1`, `"schemaVersion": 7`, "schemaVersion", "re-run gpuimage lock"},
		{"duplicate package", `"name": "systemd"`, `"name": "base-files"`, "packages[1]", "also locked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(string(good), c.old, c.new, 1)
			if src == string(good) {
				t.Fatalf("edit %q did not apply", c.old)
			}
			_, err := ParseLock("x.lock.json", []byte(src))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("want Errors, got %v", err)
			}
			for _, e := range es {
				if e.Field == c.field && e.Line > 1 && strings.Contains(e.Msg, c.text) {
					return
				}
			}
			t.Errorf("want an error on %s containing %q with a line; got:\n%v", c.field, c.text, err)
		})
	}
}

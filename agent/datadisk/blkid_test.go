package datadisk

import (
	"maps"
	"strings"
	"testing"
)

func TestParseBlkidExport(t *testing.T) {
	// As blkid -p -o export prints an ext4 filesystem whose label has a space.
	out := "DEVNAME=/dev/loop3\nUUID=0c2f8d5e-1d4e-4f32-a2b7-8b4b9d5a1f00\nVERSION=1.0\nBLOCK_SIZE=4096\nLABEL=my\\ data\nTYPE=ext4\nUSAGE=filesystem\n"
	got, err := parseBlkidExport([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"DEVNAME": "/dev/loop3", "UUID": "0c2f8d5e-1d4e-4f32-a2b7-8b4b9d5a1f00", "VERSION": "1.0", "BLOCK_SIZE": "4096", "LABEL": "my data", "TYPE": "ext4", "USAGE": "filesystem"}
	if !maps.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	for _, bad := range []string{"TYPE", "type=ext4", "=x", "TYPE=a\nTYPE=b", "TY PE=x"} {
		if _, err := parseBlkidExport([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if got, err := parseBlkidExport(nil); err != nil || len(got) != 0 {
		t.Errorf("empty output: %v, %v", got, err)
	}
}

// FuzzParseBlkidExport: blkid's output carries labels and names from a disk's content,
// which anyone may have written. Parsing never panics, and what parses keeps its keys
// valid and its values on one line.
func FuzzParseBlkidExport(f *testing.F) {
	f.Add([]byte("TYPE=zfs_member\nLABEL=tank\nUSAGE=raid\n"))
	f.Add([]byte("PTUUID=1b1e\nPTTYPE=gpt\n"))
	f.Add([]byte("LABEL=a\\\\b\\ c\\"))
	f.Fuzz(func(t *testing.T, out []byte) {
		fields, err := parseBlkidExport(out)
		if err != nil {
			return
		}
		for k, v := range fields {
			if !validBlkidKey(k) || strings.Contains(v, "\n") {
				t.Fatalf("parsed %q=%q from %q", k, v, out)
			}
		}
		describeSignature(fields)
	})
}

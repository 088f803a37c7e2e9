package enroll

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/agent/joinbundle"
)

// TestKeyKeptAcrossRestarts: the first start makes the key, later starts reuse it,
// with mode 0600, in the file joinbundle.LoadCredentials reads.
func TestKeyKeptAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "gpurack")
	k1, created, err := LoadOrCreateKey(dir)
	if err != nil || !created {
		t.Fatalf("first start: created=%v err=%v", created, err)
	}
	k2, created, err := LoadOrCreateKey(dir)
	if err != nil || created || !k1.Equal(k2) {
		t.Fatalf("restart: created=%v err=%v same=%v", created, err, k1.Equal(k2))
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v", fi.Mode(), err)
	}
	if joinbundle.DefaultKeyDir != "/run/gpurack" {
		t.Errorf("default key dir %s", joinbundle.DefaultKeyDir)
	}
	os.WriteFile(filepath.Join(dir, KeyFile), []byte("garbage"), 0o600)
	if _, _, err := LoadOrCreateKey(dir); err == nil {
		t.Fatal("a corrupt key file was accepted")
	}
}

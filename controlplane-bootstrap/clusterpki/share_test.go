package clusterpki

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
)

// sharedFromNewPKI makes a PKI and returns its shared roots.
func sharedFromNewPKI(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	cfg := clusterconfig.Default()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := Ensure(dir, &cfg); err != nil {
		t.Fatal(err)
	}
	files, err := ReadRoots(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, files
}

// TestSealOpenWriteRoots: the shared roots survive sealing and opening, and written
// on another host they make a PKI whose CA is the first's, with leaves of its own.
func TestSealOpenWriteRoots(t *testing.T) {
	dir, files := sharedFromNewPKI(t)
	key, err := NewCertificateKey()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := SealRoots(files, key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range sealed {
		if bytes.Contains(b, files[name]) {
			t.Errorf("%s is in the clear in its sealed form", name)
		}
	}
	opened, err := OpenRoots(sealed, key)
	if err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(t.TempDir(), "pki")
	if err := WriteRoots(second, opened); err != nil {
		t.Fatal(err)
	}
	cfg := clusterconfig.Default()
	cfg.NodeName, cfg.APIServer.AdvertiseAddress = "control-plane-2", "127.0.0.2"
	set, err := Ensure(second, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	first, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if set.CAPin() != first.CAPin() || !bytes.Equal(set.EncryptionKey, first.EncryptionKey) {
		t.Error("the second host's CA or encryption key differs from the first's")
	}
	if fi, err := os.Stat(filepath.Join(second, CAKey)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key on the second host: %v %v; want mode 0600", fi.Mode(), err)
	}
	if err := WriteRoots(second, opened); err == nil {
		t.Error("WriteRoots over an existing PKI succeeded")
	}
}

// TestOpenRootsRefusesBadInput: a wrong key, a file swapped for another's sealed bytes,
// a truncated file, a missing one and an extra one are refused, and nothing is written.
func TestOpenRootsRefusesBadInput(t *testing.T) {
	_, files := sharedFromNewPKI(t)
	key, _ := NewCertificateKey()
	other, _ := NewCertificateKey()
	sealed, err := SealRoots(files, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRoots(sealed, other); !errors.Is(err, ErrWrongCertificateKey) {
		t.Errorf("a wrong key: %v; want ErrWrongCertificateKey", err)
	}
	if _, err := OpenRoots(sealed, "abc"); err == nil {
		t.Error("a key of 3 characters was taken")
	}
	cases := map[string]func(m map[string][]byte){
		"swapped":   func(m map[string][]byte) { m[CAKey] = m[EtcdCAKey] },
		"truncated": func(m map[string][]byte) { m[SAKey] = m[SAKey][:10] },
		"missing":   func(m map[string][]byte) { delete(m, EncryptionKey) },
		"extra":     func(m map[string][]byte) { m["../../etc/passwd"] = m[CACert] },
	}
	for name, mutate := range cases {
		m := map[string][]byte{}
		for k, v := range sealed {
			m[k] = v
		}
		mutate(m)
		if _, err := OpenRoots(m, key); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
}

// FuzzOpenRoots: whatever the Secret holds, OpenRoots returns an error or exactly the
// shared roots, and never panics.
func FuzzOpenRoots(f *testing.F) {
	f.Add([]byte("x"), "0000000000000000000000000000000000000000000000000000000000000000")
	f.Fuzz(func(t *testing.T, data []byte, key string) {
		m := map[string][]byte{}
		for _, n := range SharedRoots {
			m[n] = data
		}
		out, err := OpenRoots(m, key)
		if err == nil && len(out) != len(SharedRoots) {
			t.Fatalf("opened %d files", len(out))
		}
	})
}

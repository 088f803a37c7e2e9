package manifest

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeImage writes a complete, signed image directory and returns it with
// the manifest and the public key.
func writeImage(t *testing.T) (string, *Manifest, ed25519.PublicKey) {
	t.Helper()
	dir := t.TempDir()
	pub, priv := mustKey(t)
	contents := map[string][]byte{
		ArtifactKernel:  []byte("kernel image bytes"),
		ArtifactInitrd:  []byte("initramfs bytes"),
		ArtifactRootfs:  []byte(strings.Repeat("squashfs block ", 10000)),
		ArtifactCmdline: []byte("console=ttyS0 gpurack.rootfs.sha256=abc\n"),
		ArtifactSBOM:    []byte("{}\n"),
	}
	m := testManifest()
	m.Artifacts = nil
	for name, data := range contents {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := ArtifactOf(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if a.SHA256 != hex.EncodeToString(sum[:]) || a.Size != int64(len(data)) {
			t.Fatalf("ArtifactOf(%s) = %+v", name, a)
		}
		m.Artifacts = append(m.Artifacts, a)
	}
	if err := WriteSigned(dir, m, priv); err != nil {
		t.Fatal(err)
	}
	sortArtifacts(m.Artifacts)
	return dir, m, pub
}

func TestVerifyDirGood(t *testing.T) {
	dir, want, pub := writeImage(t)
	got, err := VerifyDir(dir, []ed25519.PublicKey{pub})
	if err != nil {
		t.Fatalf("VerifyDir: %v", err)
	}
	if got.ImageID != want.ImageID || len(got.Artifacts) != len(want.Artifacts) {
		t.Errorf("VerifyDir returned %+v", got)
	}
	// A symbolic link that stays inside the directory is fine.
	real := filepath.Join(dir, "rootfs.real")
	if err := os.Rename(filepath.Join(dir, ArtifactRootfs), real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("rootfs.real", filepath.Join(dir, ArtifactRootfs)); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyDir(dir, []ed25519.PublicKey{pub}); err != nil {
		t.Errorf("VerifyDir with an in-directory symlink: %v", err)
	}
}

func TestVerifyDirFlippedByte(t *testing.T) {
	dir, m, pub := writeImage(t)
	path := filepath.Join(dir, ArtifactRootfs)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/3] ^= 0x01
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = VerifyDir(dir, []ed25519.PublicKey{pub})
	if err == nil {
		t.Fatal("VerifyDir accepted a rootfs with a flipped byte")
	}
	want, _ := m.Artifact(ArtifactRootfs)
	sum := sha256.Sum256(data)
	got := hex.EncodeToString(sum[:])
	for _, s := range []string{ArtifactRootfs, want.SHA256, got, dir} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not contain %q:\n%v", s, err)
		}
	}
	for _, other := range []string{ArtifactKernel, ArtifactInitrd, ArtifactCmdline, ArtifactSBOM} {
		if strings.Contains(err.Error(), other+":") {
			t.Errorf("error blames %s, which is intact:\n%v", other, err)
		}
	}
	var ae *ArtifactError
	if !errors.As(err, &ae) || ae.Name != ArtifactRootfs || ae.Got.SHA256 != got || ae.Want.SHA256 != want.SHA256 {
		t.Errorf("errors.As ArtifactError = %+v", ae)
	}
}

func TestVerifyDirFailures(t *testing.T) {
	tests := []struct {
		name     string
		breakDir func(t *testing.T, dir string)
		keys     func(pub ed25519.PublicKey) []ed25519.PublicKey
		wants    []string
	}{
		{"truncated artifact", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, ArtifactInitrd), []byte("init"), 0o644)
		}, nil, []string{ArtifactInitrd, "size is 4 bytes", "says 15"}},
		{"two bad artifacts, both named", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, ArtifactInitrd), []byte("init"), 0o644)
			os.WriteFile(filepath.Join(dir, ArtifactCmdline), []byte("console=ttyS1 gpurack.rootfs.sha256=abc\n"), 0o644)
		}, nil, []string{ArtifactInitrd, ArtifactCmdline}},
		{"missing artifact", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ArtifactKernel))
		}, nil, []string{ArtifactKernel, "missing"}},
		{"artifact is a directory", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ArtifactSBOM))
			os.Mkdir(filepath.Join(dir, ArtifactSBOM), 0o755)
		}, nil, []string{ArtifactSBOM, "not a regular file"}},
		{"artifact is a FIFO", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ArtifactSBOM))
			if err := syscall.Mkfifo(filepath.Join(dir, ArtifactSBOM), 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil, []string{ArtifactSBOM, "not a regular file"}},
		{"symlink escaping the directory", func(t *testing.T, dir string) {
			outside := filepath.Join(t.TempDir(), "rootfs.squashfs")
			data, _ := os.ReadFile(filepath.Join(dir, ArtifactRootfs))
			os.WriteFile(outside, data, 0o644) // identical content: only the location is wrong
			os.Remove(filepath.Join(dir, ArtifactRootfs))
			os.Symlink(outside, filepath.Join(dir, ArtifactRootfs))
		}, nil, []string{ArtifactRootfs, "symbolic link leading outside"}},
		{"relative symlink escaping the directory", func(t *testing.T, dir string) {
			parent := filepath.Dir(dir)
			data, _ := os.ReadFile(filepath.Join(dir, ArtifactRootfs))
			os.WriteFile(filepath.Join(parent, "shared-rootfs"), data, 0o644)
			os.Remove(filepath.Join(dir, ArtifactRootfs))
			os.Symlink("../shared-rootfs", filepath.Join(dir, ArtifactRootfs))
		}, nil, []string{ArtifactRootfs, "symbolic link leading outside"}},
		{"manifest changed after signing", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestFile)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(data), "v1.31.4", "v1.31.5", 1)), 0o644)
		}, nil, []string{"not a signature", ManifestFile}},
		{"signature flipped", func(t *testing.T, dir string) {
			p := filepath.Join(dir, SignatureFile)
			sig, _ := os.ReadFile(p)
			sig[10] ^= 0x01
			os.WriteFile(p, sig, 0o644)
		}, nil, []string{"not a signature"}},
		{"signature base64", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, SignatureFile), []byte(strings.Repeat("QUJD", 22)), 0o644)
		}, nil, []string{"88 bytes", "not base64"}},
		{"signature missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, SignatureFile))
		}, nil, []string{SignatureFile, "missing"}},
		{"manifest missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ManifestFile))
		}, nil, []string{ManifestFile, "missing"}},
		{"untrusted key", func(t *testing.T, dir string) {}, func(ed25519.PublicKey) []ed25519.PublicKey {
			other, _, _ := GenerateKey()
			return []ed25519.PublicKey{other}
		}, []string{"by any trusted key"}},
		{"no keys", func(t *testing.T, dir string) {}, func(ed25519.PublicKey) []ed25519.PublicKey { return nil }, []string{"no trusted public keys"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _, pub := writeImage(t)
			tt.breakDir(t, dir)
			keys := []ed25519.PublicKey{pub}
			if tt.keys != nil {
				keys = tt.keys(pub)
			}
			done := make(chan struct{})
			var m *Manifest
			var err error
			go func() {
				defer close(done)
				m, err = VerifyDir(dir, keys)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("VerifyDir hung")
			}
			if err == nil {
				t.Fatalf("VerifyDir accepted it: %+v", m)
			}
			if m != nil {
				t.Errorf("VerifyDir returned a manifest along with an error")
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
	if _, err := VerifyDir(filepath.Join(t.TempDir(), "nope"), nil); err == nil {
		t.Errorf("VerifyDir of a missing directory succeeded")
	}
}

func TestWriteSignedRefusesInvalid(t *testing.T) {
	dir := t.TempDir()
	_, priv := mustKey(t)
	m := testManifest()
	m.Artifacts[0].Name = "../x"
	if err := WriteSigned(dir, m, priv); err == nil {
		t.Errorf("WriteSigned wrote an invalid manifest")
	}
	if err := WriteSigned(dir, testManifest(), priv[:10]); err == nil {
		t.Errorf("WriteSigned with a malformed key succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("WriteSigned left %d files after failing", len(entries))
	}
}

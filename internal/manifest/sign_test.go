package manifest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

func mustKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestSignVerify(t *testing.T) {
	pub, priv := mustKey(t)
	otherPub, _ := mustKey(t)
	data, err := Marshal(testManifest())
	if err != nil {
		t.Fatal(err)
	}
	sig := Sign(priv, data)
	if len(sig) != ed25519.SignatureSize {
		t.Fatalf("signature is %d bytes", len(sig))
	}
	if err := Verify([]ed25519.PublicKey{pub}, data, sig); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if err := Verify([]ed25519.PublicKey{otherPub, pub}, data, sig); err != nil {
		t.Errorf("Verify with the signer second in the list: %v", err)
	}
	err = Verify([]ed25519.PublicKey{otherPub}, data, sig)
	if err == nil || !strings.Contains(err.Error(), KeyID(otherPub)) {
		t.Errorf("Verify by another key: err = %v, want one listing the key tried", err)
	}
	if err := Verify(nil, data, sig); err == nil || !strings.Contains(err.Error(), "no trusted public keys") {
		t.Errorf("Verify without keys: err = %v", err)
	}
	if err := Verify([]ed25519.PublicKey{pub}, data, sig[:63]); err == nil || !strings.Contains(err.Error(), "64 raw bytes") {
		t.Errorf("short signature: err = %v", err)
	}
	if err := Verify([]ed25519.PublicKey{ed25519.PublicKey("short")}, data, sig); err == nil {
		t.Errorf("malformed key verified")
	}
	// Flipping any single byte of the manifest or of the signature fails.
	for i := range data {
		d := append([]byte(nil), data...)
		d[i] ^= 0x01
		if Verify([]ed25519.PublicKey{pub}, d, sig) == nil {
			t.Fatalf("manifest with byte %d flipped still verifies", i)
		}
	}
	for i := range sig {
		s := append([]byte(nil), sig...)
		s[i] ^= 0x80
		if Verify([]ed25519.PublicKey{pub}, data, s) == nil {
			t.Fatalf("signature with byte %d flipped still verifies", i)
		}
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	privPath, pubPath := filepath.Join(dir, "image-signing.key"), filepath.Join(dir, "image-signing.pub")
	pub, priv := mustKey(t)
	if err := WriteKeyPair(privPath, pubPath, priv); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{privPath: 0o600, pubPath: 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	pubPEM, _ := os.ReadFile(pubPath)
	privPEM, _ := os.ReadFile(privPath)
	if !strings.HasPrefix(string(pubPEM), "-----BEGIN PUBLIC KEY-----\n") || !strings.HasPrefix(string(privPEM), "-----BEGIN PRIVATE KEY-----\n") {
		t.Errorf("unexpected PEM types:\n%s\n%s", pubPEM, privPEM)
	}
	gotPriv, err := LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	if !gotPriv.Equal(priv) {
		t.Errorf("loaded private key differs")
	}
	pubs, err := LoadPublicKeys(pubPath, pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != 2 || !pubs[0].Equal(pub) {
		t.Errorf("loaded public keys differ")
	}

	// Never overwritten.
	_, priv2 := mustKey(t)
	if err := WriteKeyPair(privPath, filepath.Join(dir, "new.pub"), priv2); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("WriteKeyPair over an existing key: err = %v", err)
	}
	if again, _ := LoadPrivateKey(privPath); !again.Equal(priv) {
		t.Errorf("existing key was replaced")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want 2 (no temporary files)", len(entries))
	}

	// Wrong kinds of key are refused with a message naming the file.
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPubDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	ecPrivDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPub := filepath.Join(dir, "ec.pub")
	ecPriv := filepath.Join(dir, "ec.key")
	os.WriteFile(ecPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPubDER}), 0o644)
	os.WriteFile(ecPriv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecPrivDER}), 0o600)
	if _, err := LoadPublicKeys(pubPath, ecPub); err == nil || !strings.Contains(err.Error(), ecPub) || !strings.Contains(err.Error(), "want ed25519") {
		t.Errorf("ECDSA public key: err = %v", err)
	}
	if _, err := LoadPrivateKey(ecPriv); err == nil || !strings.Contains(err.Error(), ecPriv) || !strings.Contains(err.Error(), "want ed25519") {
		t.Errorf("ECDSA private key: err = %v", err)
	}
	if _, err := LoadPublicKeys(privPath); err == nil || !strings.Contains(err.Error(), "PUBLIC KEY") {
		t.Errorf("private key given as public key: err = %v", err)
	}
	if _, err := LoadPrivateKey(filepath.Join(dir, "missing.key")); err == nil || !strings.Contains(err.Error(), "missing.key") {
		t.Errorf("missing key: err = %v", err)
	}
}

// TestOpenSSLInterop checks the formats against openssl in both directions:
// openssl verifies gpurack's signature with gpurack's public key file, and
// gpurack verifies openssl's signature made with an openssl-generated key.
func TestOpenSSLInterop(t *testing.T) {
	testreq.Tool(t, "openssl", "apt-get install openssl (hack/deps.sh lists it); it cross-checks the formats")
	run := func(args ...string) (string, error) {
		out, err := exec.Command("openssl", args...).CombinedOutput()
		return string(out), err
	}
	dir := t.TempDir()
	privPath, pubPath := filepath.Join(dir, "key.pem"), filepath.Join(dir, "pub.pem")
	_, priv := mustKey(t)
	if err := WriteKeyPair(privPath, pubPath, priv); err != nil {
		t.Fatal(err)
	}
	data, err := Marshal(testManifest())
	if err != nil {
		t.Fatal(err)
	}
	manifestPath, sigPath := filepath.Join(dir, ManifestFile), filepath.Join(dir, SignatureFile)
	if err := WriteSigned(dir, testManifest(), priv); err != nil {
		t.Fatal(err)
	}
	verify := []string{"pkeyutl", "-verify", "-rawin", "-pubin", "-inkey", pubPath, "-sigfile", sigPath, "-in", manifestPath}
	if out, err := run(verify...); err != nil || !strings.Contains(out, "Signature Verified Successfully") {
		t.Fatalf("openssl rejects gpurack's signature: %v\n%s", err, out)
	}
	// A flipped byte in the manifest: openssl must reject it too.
	tampered := append([]byte(nil), data...)
	tampered[len(tampered)/2] ^= 0x01
	if err := os.WriteFile(manifestPath, tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(verify...); err == nil {
		t.Errorf("openssl accepted a tampered manifest:\n%s", out)
	}

	// openssl-made key and signature, checked by gpurack.
	osslKey, osslPub, osslSig := filepath.Join(dir, "ossl.key"), filepath.Join(dir, "ossl.pub"), filepath.Join(dir, "ossl.sig")
	if err := os.WriteFile(manifestPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"genpkey", "-algorithm", "ed25519", "-out", osslKey},
		{"pkey", "-in", osslKey, "-pubout", "-out", osslPub},
		{"pkeyutl", "-sign", "-rawin", "-inkey", osslKey, "-in", manifestPath, "-out", osslSig},
	} {
		if out, err := run(args...); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	pubs, err := LoadPublicKeys(osslPub)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := os.ReadFile(osslSig)
	if err := Verify(pubs, data, sig); err != nil {
		t.Errorf("gpurack rejects openssl's signature: %v", err)
	}
	k, err := LoadPrivateKey(osslKey)
	if err != nil {
		t.Fatalf("gpurack cannot load openssl's private key: %v", err)
	}
	// ed25519 is deterministic: the same key signs the same bytes identically.
	if got := Sign(k, data); string(got) != string(sig) {
		t.Errorf("gpurack's signature with openssl's key differs from openssl's")
	}
}

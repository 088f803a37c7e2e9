package manifest

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// PEM block types of the signing keys, the ones openssl reads and writes.
const (
	pemPublicKey  = "PUBLIC KEY"  // PKIX SubjectPublicKeyInfo, RFC 8410
	pemPrivateKey = "PRIVATE KEY" // PKCS#8, RFC 8410
)

// GenerateKey returns a new ed25519 key pair for signing manifests.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	return pub, priv, nil
}

// MarshalPublicKeyPEM returns pub as a PKIX PEM "PUBLIC KEY" block.
func MarshalPublicKeyPEM(pub ed25519.PublicKey) ([]byte, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("ed25519 public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}

// MarshalPrivateKeyPEM returns priv as an unencrypted PKCS#8 PEM
// "PRIVATE KEY" block.
func MarshalPrivateKeyPEM(priv ed25519.PrivateKey) ([]byte, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("ed25519 private key is %d bytes, want %d", len(priv), ed25519.PrivateKeySize)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePublicKeyPEM parses a PKIX PEM "PUBLIC KEY" block holding an
// ed25519 key (what `openssl pkey -pubout` writes).
func ParsePublicKeyPEM(data []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found: want an ed25519 \"PUBLIC KEY\" (`openssl pkey -in key.pem -pubout`)")
	}
	if block.Type != pemPublicKey {
		return nil, fmt.Errorf("PEM block is %q, want %q: give the public key of the signing key", block.Type, pemPublicKey)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key is %s, want ed25519: image signing keys are ed25519", keyKind(key))
	}
	return pub, nil
}

// ParsePrivateKeyPEM parses an unencrypted PKCS#8 PEM "PRIVATE KEY" block
// holding an ed25519 key (what `openssl genpkey -algorithm ed25519` writes).
func ParsePrivateKeyPEM(data []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found: want an ed25519 \"PRIVATE KEY\" (`openssl genpkey -algorithm ed25519`)")
	}
	switch block.Type {
	case pemPrivateKey:
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New("the private key is encrypted: gpuimage needs it unencrypted (`openssl pkey -in key.pem -out plain.pem`)")
	default:
		return nil, fmt.Errorf("PEM block is %q, want %q", block.Type, pemPrivateKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PKCS#8 private key: %w", err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %s, want ed25519: generate one with `gpuimage` or `openssl genpkey -algorithm ed25519`", keyKind(key))
	}
	return priv, nil
}

func keyKind(key any) string {
	t := fmt.Sprintf("%T", key)
	return strings.TrimPrefix(strings.TrimPrefix(t, "*"), "crypto/")
}

// WriteKeyPair writes priv to privPath (PKCS#8 PEM, mode 0600) and its
// public key to pubPath (PKIX PEM, mode 0644). Each file is written to a
// temporary file and linked into place, so a crash leaves the whole file or
// none. It never replaces an existing file: losing a signing key would
// strand every gpuboot configured with it, so if either path exists it
// returns an error and writes nothing.
func WriteKeyPair(privPath, pubPath string, priv ed25519.PrivateKey) error {
	privPEM, err := MarshalPrivateKeyPEM(priv)
	if err != nil {
		return fmt.Errorf("write key pair: %w", err)
	}
	pubPEM, err := MarshalPublicKeyPEM(priv.Public().(ed25519.PublicKey))
	if err != nil {
		return fmt.Errorf("write key pair: %w", err)
	}
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("write key pair: %s already exists; a new key would not replace it: choose another path, or move the old key away first", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("write key pair: %w", err)
		}
	}
	if err := atomicfile.Create(privPath, privPEM, 0o600); err != nil {
		return fmt.Errorf("write key pair: %w", err)
	}
	if err := atomicfile.Create(pubPath, pubPEM, 0o644); err != nil {
		os.Remove(privPath) // written by this call; useless alone, and would block a retry
		return fmt.Errorf("write key pair: %w", err)
	}
	return nil
}

// LoadPrivateKey reads an ed25519 private key written by WriteKeyPair (or
// by `openssl genpkey -algorithm ed25519`).
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	priv, err := ParsePrivateKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	return priv, nil
}

// LoadPublicKeys reads one ed25519 public key from each path, in order
// (gpuboot's list of trusted image keys).
func LoadPublicKeys(paths ...string) ([]ed25519.PublicKey, error) {
	pubs := make([]ed25519.PublicKey, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("load image public key: %w", err)
		}
		pub, err := ParsePublicKeyPEM(data)
		if err != nil {
			return nil, fmt.Errorf("load image public key %s: %w", p, err)
		}
		pubs = append(pubs, pub)
	}
	return pubs, nil
}

// KeyID returns a short name for pub for logs and errors: "sha256:" and
// the first 16 hex characters of the SHA-256 of its PKIX DER encoding (the
// bytes of the PEM file's body).
func KeyID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "invalid-key"
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Sign returns the raw 64-byte ed25519 signature of manifestBytes, the
// exact bytes of manifest.json. manifest.sig holds these 64 bytes as they
// are (not base64, not PEM), which is what `openssl pkeyutl -verify -rawin
// -sigfile` reads. Like ed25519.Sign it panics if priv is not an ed25519
// private key (64 bytes); keys from GenerateKey or LoadPrivateKey are.
func Sign(priv ed25519.PrivateKey, manifestBytes []byte) []byte {
	return ed25519.Sign(priv, manifestBytes)
}

// Verify returns nil if sig is a valid ed25519 signature of manifestBytes
// by any key in pubs, and an error saying why not otherwise.
func Verify(pubs []ed25519.PublicKey, manifestBytes, sig []byte) error {
	if len(pubs) == 0 {
		return errors.New("verify manifest signature: no trusted public keys configured: list the image signing keys (PEM files) in the configuration")
	}
	if len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("verify manifest signature: %s is %d bytes; an ed25519 signature is %d raw bytes (not base64 or PEM)", SignatureFile, len(sig), ed25519.SignatureSize)
	}
	ids := make([]string, 0, len(pubs))
	for _, pub := range pubs {
		if len(pub) != ed25519.PublicKeySize {
			ids = append(ids, "invalid-key")
			continue
		}
		if ed25519.Verify(pub, manifestBytes, sig) {
			return nil
		}
		ids = append(ids, KeyID(pub))
	}
	return fmt.Errorf("verify manifest signature: %s is not a signature of %s by any trusted key (%s): the manifest was changed after signing, or it was signed by a key this configuration does not trust",
		SignatureFile, ManifestFile, strings.Join(ids, ", "))
}

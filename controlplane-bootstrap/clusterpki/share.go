package clusterpki

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SharedRoots are the files every control-plane host must hold the same of: the three
// CAs with their keys, the service-account key pair and the encryption key for Secrets
// at rest. Each host issues its own leaves from them. `upload-certs` seals them for
// `join --control-plane` (docs/ha.md), as kubeadm's --upload-certs does.
var SharedRoots = []string{CACert, CAKey, FrontProxyCACert, FrontProxyCAKey, EtcdCACert, EtcdCAKey, SAKey, SAPub, EncryptionKey}

// CertificateKeyBytes is the length of a certificate key: AES-256.
const CertificateKeyBytes = 32

// ErrWrongCertificateKey is what OpenRoots returns when the key does not open a file.
var ErrWrongCertificateKey = errors.New("the certificate key does not open the shared certificates: check --certificate-key, or run upload-certs again on a control-plane host (each run makes a new key)")

// NewCertificateKey is a random certificate key, as hex (64 characters).
func NewCertificateKey() (string, error) {
	k := make([]byte, CertificateKeyBytes)
	if _, err := rand.Read(k); err != nil {
		return "", err
	}
	return hex.EncodeToString(k), nil
}

func aead(key string) (cipher.AEAD, error) {
	k, err := hex.DecodeString(strings.TrimSpace(key))
	if err != nil || len(k) != CertificateKeyBytes {
		return nil, fmt.Errorf("certificate key: want %d hex characters (as upload-certs printed it)", 2*CertificateKeyBytes)
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// ReadRoots reads SharedRoots from the PKI directory dir.
func ReadRoots(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, name := range SharedRoots {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("cluster PKI: %w", err)
		}
		out[name] = b
	}
	return out, nil
}

// SealRoots encrypts each of files with key (AES-256-GCM, a fresh nonce before each
// ciphertext; the file's name is its additional data, so that one file's sealed bytes
// cannot stand in for another's).
func SealRoots(files map[string][]byte, key string) (map[string][]byte, error) {
	g, err := aead(key)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for name, b := range files {
		nonce := make([]byte, g.NonceSize())
		if _, err := rand.Read(nonce); err != nil {
			return nil, err
		}
		out[name] = g.Seal(nonce, nonce, b, []byte(name))
	}
	return out, nil
}

// OpenRoots decrypts sealed with key. It wants exactly SharedRoots, and fails whole:
// ErrWrongCertificateKey when the key opens none of them.
func OpenRoots(sealed map[string][]byte, key string) (map[string][]byte, error) {
	g, err := aead(key)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, name := range SharedRoots {
		b, ok := sealed[name]
		if !ok {
			return nil, fmt.Errorf("the shared certificates lack %s: run upload-certs again", name)
		}
		if len(b) < g.NonceSize()+g.Overhead() {
			return nil, fmt.Errorf("the shared %s is %d bytes, too short to be sealed: run upload-certs again", name, len(b))
		}
		plain, err := g.Open(nil, b[:g.NonceSize()], b[g.NonceSize():], []byte(name))
		if err != nil {
			return nil, ErrWrongCertificateKey
		}
		out[name] = plain
	}
	for name := range sealed {
		if !slices.Contains(SharedRoots, name) {
			return nil, fmt.Errorf("the shared certificates hold %q, which is none of a control plane's shared files", name)
		}
	}
	return out, nil
}

// WriteRoots makes dir, which must not exist, a PKI directory holding files (the
// output of OpenRoots): written into a temporary directory beside it, loaded there to
// check that the CAs and keys parse and match, then renamed into place, so that a
// failure leaves nothing. EnsureValidity then issues this host's leaves from them.
func WriteRoots(dir string, files map[string][]byte) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s already exists: this host already has a cluster PKI (reset it first)", dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	return fillThenRename(dir, func(tmp string) error { return writeShared(tmp, files) })
}

// writeShared writes files into tmp and checks that they load as a PKI.
func writeShared(tmp string, files map[string][]byte) error {
	for _, name := range SharedRoots {
		b, ok := files[name]
		if !ok {
			return fmt.Errorf("cluster PKI: %s missing from the shared certificates", name)
		}
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(name, ".key") {
			mode = 0o600
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tmp, name)), 0o700); err != nil {
			return fmt.Errorf("cluster PKI: %w", err)
		}
		if err := writeFile(filepath.Join(tmp, name), b, mode); err != nil {
			return err
		}
	}
	if _, err := Load(tmp); err != nil {
		return fmt.Errorf("the shared certificates do not make a cluster PKI: %w", err)
	}
	return nil
}

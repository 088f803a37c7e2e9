package pki

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// File names of a CA in its directory (the names kubeadm uses).
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// File modes: private keys are readable by their owner only.
const (
	certFileMode fs.FileMode = 0o644
	keyFileMode  fs.FileMode = 0o600
)

// SaveCA writes ca to dir/ca.crt (mode 0644) and dir/ca.key (mode 0600),
// creating dir (mode 0700) if needed. Each file is written to a temporary
// file and then linked into place, so a crash leaves either the whole file
// or none. SaveCA never replaces an existing CA: a new CA would orphan every
// certificate the old one issued, so if either file exists it returns an
// error and writes nothing.
func SaveCA(dir string, ca *CA) error {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return errors.New("save CA: the CA has no certificate or no key")
	}
	certPath := filepath.Join(dir, CACertFile)
	keyPath := filepath.Join(dir, CAKeyFile)
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("save CA: %s already exists; a new CA would invalidate every certificate the existing one issued: use the existing CA, or move %s away first", p, dir)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("save CA: %w", err)
		}
	}
	keyPEM, err := EncodeKeyPEM(ca.Key)
	if err != nil {
		return fmt.Errorf("save CA: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save CA: create directory: %w", err)
	}
	if err := atomicfile.Create(keyPath, keyPEM, keyFileMode); err != nil {
		return fmt.Errorf("save CA: %w", err)
	}
	if err := atomicfile.Create(certPath, EncodeCertPEM(ca.Cert), certFileMode); err != nil {
		// The key was written by this call a moment ago; without its
		// certificate it is useless, and leaving it would block a retry.
		os.Remove(keyPath)
		return fmt.Errorf("save CA: %w", err)
	}
	return nil
}

// LoadCA reads dir/ca.crt and dir/ca.key and checks that the certificate is
// a CA and that the key belongs to it.
func LoadCA(dir string) (*CA, error) {
	kp, err := LoadKeyPair(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load CA: %w: create the CA first, or point at the directory holding %s and %s", err, CACertFile, CAKeyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	if !kp.Cert.IsCA {
		return nil, fmt.Errorf("load CA: %s is not a CA certificate (basic constraints CA:FALSE): point at the CA directory created by `gpuboot init`", filepath.Join(dir, CACertFile))
	}
	return &CA{Cert: kp.Cert, Key: kp.Key}, nil
}

// SaveKeyPair writes kp's certificate to certPath (mode 0644) and its key to
// keyPath (mode 0600), each atomically (temporary file, then rename),
// replacing files already there. Parent directories must exist.
func SaveKeyPair(certPath, keyPath string, kp *KeyPair) error {
	if kp == nil || kp.Cert == nil || kp.Key == nil {
		return errors.New("save key pair: no certificate or no key")
	}
	keyPEM, err := EncodeKeyPEM(kp.Key)
	if err != nil {
		return fmt.Errorf("save key pair: %w", err)
	}
	if err := atomicfile.Write(keyPath, keyPEM, keyFileMode); err != nil {
		return fmt.Errorf("save key pair: %w", err)
	}
	if err := atomicfile.Write(certPath, EncodeCertPEM(kp.Cert), certFileMode); err != nil {
		return fmt.Errorf("save key pair: %w", err)
	}
	return nil
}

// LoadKeyPair reads a PEM certificate and its PKCS#8 PEM key and checks that
// they belong together. Errors name the file at fault.
func LoadKeyPair(certPath, keyPath string) (*KeyPair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	cert, err := DecodeCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	key, err := DecodeKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	if err := keyMatchesCert(key, cert); err != nil {
		return nil, fmt.Errorf("%s and %s do not match: %w; restore the pair from the same backup", keyPath, certPath, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

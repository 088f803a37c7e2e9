package enroll

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// KeyFile is the enrollment key's file name in the key directory (/run/gpurack by
// default: tmpfs, so the key survives agent restarts but not reboots, CONTRACTS §2.3).
// joinbundle.LoadCredentials reads the same file for an agent_key_ref of sha256:….
const KeyFile = "agent.key"

// LoadOrCreateKey returns the ed25519 key in dir/agent.key (PKCS#8 PEM, mode 0600),
// generating and writing it when there is none. created says which.
func LoadOrCreateKey(dir string) (key ed25519.PrivateKey, created bool, err error) {
	path := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		k, err := pki.DecodeKeyPEM(data)
		if err != nil {
			return nil, false, fmt.Errorf("enrollment key %s: %w (delete it to make a new one; the machine then re-enrolls)", path, err)
		}
		ed, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, false, fmt.Errorf("enrollment key %s is %T, want ed25519 (delete it to make a new one)", path, k)
		}
		return ed, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("enrollment key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("enrollment key dir: %w", err)
	}
	_, key, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, err
	}
	pemKey, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return nil, false, err
	}
	// Written atomically, so a crash never leaves a half-written key behind.
	if err := atomicfile.Write(path, pemKey, 0o600); err != nil {
		return nil, false, fmt.Errorf("enrollment key: %w", err)
	}
	return key, true, nil
}

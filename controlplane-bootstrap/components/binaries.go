package components

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// K8sDirEnv names the environment variable that points at the pinned
// binaries' folder (the same variable hack/k8s-bins.sh and the Makefile use).
const K8sDirEnv = "GPURACK_K8S_DIR"

// PinnedVersion is the version folder `make k8s-bins` builds into.
const PinnedVersion = "v1.34.2"

// BinDir returns where the pinned binaries are: override if set, else
// $GPURACK_K8S_DIR/bin, else the cache default
// ${GPURACK_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpurack}/k8s/v1.34.2/bin.
func BinDir(override string) string {
	if override != "" {
		return override
	}
	if d := os.Getenv(K8sDirEnv); d != "" {
		return filepath.Join(d, "bin")
	}
	cache := os.Getenv("GPURACK_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				home = "/root"
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "gpurack")
	}
	return filepath.Join(cache, "k8s", PinnedVersion, "bin")
}

// MissingBinaryError says which pinned binary is absent and how to get it.
type MissingBinaryError struct {
	Name string
	Path string
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("%s not found at %s: run `make k8s-bins` to build the pinned Kubernetes %s and etcd binaries (or set %s to their folder)",
		e.Name, e.Path, PinnedVersion, K8sDirEnv)
}

// FindBinary returns the path of the pinned binary name in dir, or a
// *MissingBinaryError.
func FindBinary(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &MissingBinaryError{Name: name, Path: p}
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s at %s is not an executable file: run `make k8s-bins` again", name, p)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return abs, nil
}

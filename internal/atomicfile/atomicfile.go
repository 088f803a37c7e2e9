// Package atomicfile writes files so that a crash leaves either the old content or the
// new, never a torn file: data goes to a temporary file beside the target, is synced,
// and is then renamed (or linked, to refuse replacing) into place, and the directory is
// synced so the new name survives.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, created with perm.
func Write(path string, data []byte, perm fs.FileMode) error { return write(path, data, perm, true) }

// Create writes data to path with perm, and fails if path already exists.
func Create(path string, data []byte, perm fs.FileMode) error { return write(path, data, perm, false) }

func write(path string, data []byte, perm fs.FileMode, replace bool) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer func() {
		if tmp != nil {
			tmp.Close()
		}
		if err != nil || !replace {
			os.Remove(tmpName)
		}
	}()
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = tmp.Close()
	tmp = nil
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if replace {
		err = os.Rename(tmpName, path)
	} else {
		err = os.Link(tmpName, path)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: it already exists and will not be replaced", path)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

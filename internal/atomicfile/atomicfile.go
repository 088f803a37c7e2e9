// Package atomicfile writes files so that a crash leaves either the old content or the
// new, never a torn file: data goes to a temporary file beside the target, is synced
// (fsync), and is then renamed (or linked, to refuse replacing) into place, and the
// directory is synced so the new name survives a power loss too.
//
// It is the project's one way to write a file that must not be torn: keys, certificates,
// kubeconfigs, manifests, units. It is not for logs or files that are appended to.
package atomicfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Write replaces path with data, created with perm (exactly: the umask does not apply).
// The directory must exist.
func Write(path string, data []byte, perm fs.FileMode) error { return write(path, data, perm, true) }

// WriteMkdirAll is Write after creating path's missing parent directories with dirPerm
// (which the umask trims, as with os.MkdirAll).
func WriteMkdirAll(path string, data []byte, perm, dirPerm fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), dirPerm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return write(path, data, perm, true)
}

// Create writes data to path with perm, and fails if path already exists.
func Create(path string, data []byte, perm fs.FileMode) error { return write(path, data, perm, false) }

// WriteJSON writes v as indented JSON, ending in a newline, as WriteMkdirAll does: the
// format of the control plane's small record files (users, registry credentials).
func WriteJSON(path string, v any, perm, dirPerm fs.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteMkdirAll(path, append(data, '\n'), perm, dirPerm)
}

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
	// The data must be on disk before the new name is: otherwise a crash after the
	// rename can leave an empty or partial file under the final name.
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
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: the file is in place, but syncing its directory failed, so it may not survive a power loss: %w", path, err)
	}
	return nil
}

// syncDir makes a rename or link in dir durable. File systems that cannot sync a
// directory (EINVAL, ENOTSUP) order their metadata themselves; that is not an error.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return err
	}
	return nil
}

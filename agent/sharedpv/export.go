// Package sharedpv is gpurack's shared volumes (the gpurack-shared StorageClass,
// docs/storage.md, decision 0677): one agent in the cluster, elected through a
// Lease, mounts the NFS export a class names and provisions each claim as a
// directory of its own under the export's volumes/, shown to pods as an `nfs`
// PersistentVolume. Deleting a volume archives its directory (or removes it, when
// the class says onDelete: delete). A ReadOnlyMany claim that names another claim
// (sharedvol.AnnViewOf) gets a read-only view of that claim's directory.
//
// Export is the directory side; Provisioner the Kubernetes side, run by
// sig-storage-lib-external-provisioner's controller; Run the election and the mounts.
package sharedpv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// Export is an NFS export mounted at Dir. Every change it makes is to one volume's
// own directory, named by sharedvol.DirName and checked by sharedvol.CheckDirName:
// nothing above it is ever removed or moved (an empty or "." name would otherwise
// reach the whole export, as csi-driver-nfs#855 did).
type Export struct {
	Dir string
}

// Create makes volume directory name with mode (whatever the umask); one that exists
// is an error, so that two claims never share a directory by accident.
func (e Export) Create(name, pv string, mode os.FileMode) error {
	if err := sharedvol.CheckDirName(name, pv); err != nil {
		return err
	}
	parent := filepath.Join(e.Dir, sharedvol.VolumesDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("the export's %s directory: %w", sharedvol.VolumesDir, err)
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("volume directory %s exists already on the export; nothing made (a claim of that name restored by hand? move it aside first)", name)
		}
		return fmt.Errorf("volume directory %s: %w", name, err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("volume directory %s: %w", name, err)
	}
	return nil
}

// Archive moves volume directory name under ArchiveDir, its name stamped with now
// (UTC), and returns where it went. A directory already gone is not an error.
func (e Export) Archive(name, pv string, now time.Time) (string, error) {
	dir, ok, err := e.own(name, pv)
	if err != nil || !ok {
		return "", err
	}
	archive := filepath.Join(e.Dir, sharedvol.ArchiveDir)
	if err := os.MkdirAll(archive, 0o755); err != nil {
		return "", fmt.Errorf("the export's %s directory: %w", sharedvol.ArchiveDir, err)
	}
	to := filepath.Join(archive, name+"."+now.UTC().Format("20060102T150405Z"))
	if err := os.Rename(dir, to); err != nil {
		return "", fmt.Errorf("archive volume directory %s: %w", name, err)
	}
	return to, nil
}

// Remove removes volume directory name and what it holds. A directory already gone is
// not an error.
func (e Export) Remove(name, pv string) error {
	dir, ok, err := e.own(name, pv)
	if err != nil || !ok {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove volume directory %s: %w", name, err)
	}
	return nil
}

// own is volume directory name's path, checked: a directory itself (not a link to
// one) directly under VolumesDir; ok is false when it does not exist.
func (e Export) own(name, pv string) (dir string, ok bool, err error) {
	if err := sharedvol.CheckDirName(name, pv); err != nil {
		return "", false, err
	}
	dir = filepath.Join(e.Dir, sharedvol.VolumesDir, name)
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if !fi.IsDir() {
		return "", false, fmt.Errorf("%s on the export is not a directory (%s); nothing touched", name, fi.Mode().Type())
	}
	return dir, true, nil
}

// Package localpv is gpurack's node-local volumes (docs/storage.md, decision 0676):
// each node's agent provisions the gpurack-local claims the scheduler placed on its
// node, as a directory on one of its data disks under an XFS project quota of the
// claim's size, and publishes the free space the scheduler reads. Store is the node
// side (directories, quotas, records); Provisioner is the Kubernetes side, run by
// sig-storage-lib-external-provisioner's controller; Capacity publishes
// CSIStorageCapacity objects and says when a claim fits on no node.
package localpv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/localvol"
)

// recordsDir is the directory on each data disk that holds one record per volume:
// what the volume reserved and its quota project. It sits beside VolumesDir, so a
// volume's own directory holds only the pod's data.
const recordsDir = "volume-records"

// firstProject is the smallest XFS project id a volume gets; below are left to
// operators.
const firstProject = 1000

// Record is what the store keeps about one volume, as JSON in recordsDir/<name>.json.
type Record struct {
	Name    string    `json:"name"`
	Bytes   int64     `json:"bytes"`
	Project uint32    `json:"project"`
	Claim   string    `json:"claim,omitempty"` // namespace/name, for people reading the disk
	Created time.Time `json:"created"`
}

// Volume is a volume on a data disk.
type Volume struct {
	Record
	// Disk is the data disk's mount point, Path the volume's directory.
	Disk, Path string
}

// DiskSpace is one data disk's space as volumes see it: Size is the filesystem's,
// Reserved the sum of its volumes' sizes (a volume reserves its whole size: no
// overcommit), Free what a new volume may still take.
type DiskSpace struct {
	MountPoint           string
	Size, Reserved, Free int64
	Volumes              int
}

// Quotas is what the store needs of XFS project quotas (Quota is the kernel's).
type Quotas interface {
	Limit(mountPoint, dir string, project uint32, bytes int64) error
	Clear(mountPoint string, project uint32) error
}

// Store makes and removes volumes on the node's ready data disks.
type Store struct {
	// Disks returns the mount points of the data disks that are ready now.
	Disks  func() []string
	Quotas Quotas
	mu     sync.Mutex
}

// ErrNoRoom is wrapped by Create's error when no ready data disk has the room.
var ErrNoRoom = errors.New("no room")

// validName is a PersistentVolume name the store accepts as a directory name.
func validName(name string) error {
	if name == "" || len(name) > 253 || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("volume name %q is not a PersistentVolume name", name)
	}
	return nil
}

// Create makes volume name of bytes on the ready data disk with the most free space,
// with directory mode mode, or returns the one already made under that name (the
// provisioner may be asked again after a crash). The directory is made, put under a
// project quota of bytes and only then recorded; a failure removes what it made.
func (s *Store) Create(name string, bytes int64, mode os.FileMode, claim string) (Volume, error) {
	if err := validName(name); err != nil {
		return Volume{}, err
	}
	if bytes <= 0 {
		return Volume{}, fmt.Errorf("volume %s: size %d: a volume needs a positive size", name, bytes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	spaces, recs, err := s.scan()
	if err != nil {
		return Volume{}, err
	}
	if v, ok := find(recs, name); ok {
		return v, nil
	}
	best := -1
	for i, d := range spaces {
		if d.Free >= bytes && (best < 0 || d.Free > spaces[best].Free) {
			best = i
		}
	}
	if best < 0 {
		return Volume{}, fmt.Errorf("volume %s of %s: %w on this node's data disks (%s)", name, human(bytes), ErrNoRoom, describe(spaces))
	}
	mp := spaces[best].MountPoint
	rec := Record{Name: name, Bytes: bytes, Project: nextProject(recs), Claim: claim, Created: time.Now().UTC().Truncate(time.Second)}
	v := Volume{Record: rec, Disk: mp, Path: filepath.Join(mp, localvol.VolumesDir, name)}
	if err := s.make(v, mode); err != nil {
		os.Remove(v.Path)
		return Volume{}, err
	}
	return v, nil
}

func (s *Store) make(v Volume, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(v.Path), 0o711); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(v.Disk, recordsDir), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(v.Path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.Chmod(v.Path, mode); err != nil { // Mkdir's mode goes through the umask
		return err
	}
	if err := s.Quotas.Limit(v.Disk, v.Path, v.Project, v.Bytes); err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	b, _ := json.MarshalIndent(v.Record, "", "  ")
	return atomicfile.Write(filepath.Join(v.Disk, recordsDir, v.Name+".json"), b, 0o600)
}

// Delete removes volume name: its directory (only it: the path is the store's own,
// never a path read from elsewhere), its quota limit and its record. A volume the
// store does not know is already deleted.
func (s *Store) Delete(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, recs, err := s.scan()
	if err != nil {
		return err
	}
	v, ok := find(recs, name)
	if !ok {
		return nil
	}
	if err := os.RemoveAll(v.Path); err != nil {
		return fmt.Errorf("remove volume %s: %w", name, err)
	}
	if err := s.Quotas.Clear(v.Disk, v.Project); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	if err := os.Remove(filepath.Join(v.Disk, recordsDir, name+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Lookup returns volume name, if the store has it.
func (s *Store) Lookup(name string) (Volume, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, recs, err := s.scan()
	if err != nil {
		return Volume{}, false, err
	}
	v, ok := find(recs, name)
	return v, ok, nil
}

// Space is each ready data disk's space, sorted by mount point.
func (s *Store) Space() ([]DiskSpace, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	spaces, _, err := s.scan()
	return spaces, err
}

// scan reads every ready disk's size and records.
func (s *Store) scan() ([]DiskSpace, []Volume, error) {
	mps := slices.Clone(s.Disks())
	slices.Sort(mps)
	var spaces []DiskSpace
	var vols []Volume
	for _, mp := range mps {
		var st unix.Statfs_t
		if err := unix.Statfs(mp, &st); err != nil {
			return nil, nil, fmt.Errorf("data disk at %s: %w", mp, err)
		}
		d := DiskSpace{MountPoint: mp, Size: int64(st.Blocks) * st.Bsize}
		recs, err := readRecords(mp)
		if err != nil {
			return nil, nil, err
		}
		for _, r := range recs {
			d.Reserved += r.Bytes
			d.Volumes++
			vols = append(vols, Volume{Record: r, Disk: mp, Path: filepath.Join(mp, localvol.VolumesDir, r.Name)})
		}
		d.Free = max(d.Size-d.Reserved, 0)
		spaces = append(spaces, d)
	}
	return spaces, vols, nil
}

// readRecords reads the records on the disk at mp. A record that does not decode is
// an error naming the file: the space it reserves is unknown, and guessing could
// hand it to another volume.
func readRecords(mp string) ([]Record, error) {
	dir := filepath.Join(mp, recordsDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil || r.Name != name || validName(r.Name) != nil || r.Bytes <= 0 || r.Project < firstProject {
			return nil, fmt.Errorf("volume record %s does not decode to a volume named %s (%v): fix or remove it; until then no volume is made or deleted on this node", filepath.Join(dir, e.Name()), name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func find(vols []Volume, name string) (Volume, bool) {
	for _, v := range vols {
		if v.Name == name {
			return v, true
		}
	}
	return Volume{}, false
}

// nextProject is the smallest project id from firstProject no volume on any disk
// uses (ids are per filesystem, but one sequence per node keeps them unique in logs).
func nextProject(vols []Volume) uint32 {
	used := map[uint32]bool{}
	for _, v := range vols {
		used[v.Project] = true
	}
	id := uint32(firstProject)
	for used[id] {
		id++
	}
	return id
}

func describe(spaces []DiskSpace) string {
	if len(spaces) == 0 {
		return "none is ready"
	}
	var parts []string
	for _, d := range spaces {
		parts = append(parts, fmt.Sprintf("%s: %s free of %s", d.MountPoint, human(d.Free), human(d.Size)))
	}
	return strings.Join(parts, "; ")
}

// human is bytes in binary units, as Kubernetes quantities read (1.5Gi).
func human(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d bytes", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ci", float64(b)/float64(div), "KMGTP"[exp])
}

package datadisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/partition/gpt"
)

// PartitionTable is a GPT as read from a disk, in plain data.
type PartitionTable struct {
	Partitions []Partition
	// FromBackup is set when the primary GPT was damaged and the backup at the end of
	// the disk was read instead.
	FromBackup bool
}

// Partition is one GPT entry.
type Partition struct {
	Index       int    // 1-based
	Type        string // type GUID, upper case
	GUID        string // unique partition GUID, upper case
	Name        string
	Start, Size int64 // bytes
}

// maxEntryArray bounds the partition entry array Inspect lets go-diskfs read: go-diskfs
// allocates what a header announces (entries × entry size, up to 16 EiB) before reading
// it. The UEFI minimum is 16 KiB; tools write 16 KiB.
const maxEntryArray = 1 << 20

// readGPT reads the GPT of f (size bytes, logical sectors of lbs bytes) with go-diskfs.
// It returns nil and no error when neither the primary nor the backup header has the
// "EFI PART" signature; a header with the signature that cannot be read is an error,
// which Decide treats as a foreign partition table.
func readGPT(f *os.File, size int64, lbs, pbs int) (table *PartitionTable, err error) {
	primary, err := gptHeaderAt(f, int64(lbs))
	if err != nil {
		return nil, err
	}
	backup, err := gptHeaderAt(f, size-int64(lbs))
	if err != nil {
		return nil, err
	}
	if primary == nil && backup == nil {
		return nil, nil
	}
	for _, h := range []*gptHeader{primary, backup} {
		if h != nil && (h.entrySize != gpt.PartitionEntrySize || uint64(h.entries)*uint64(h.entrySize) > maxEntryArray) {
			return nil, fmt.Errorf("GPT header announces %d entries of %d bytes, which gpurack does not read", h.entries, h.entrySize)
		}
	}
	defer func() {
		if r := recover(); r != nil { // go-diskfs indexes with values read from the disk
			table, err = nil, fmt.Errorf("reading the GPT failed: %v", r)
		}
	}()
	t, err := gpt.Read(readOnly{f}, lbs, pbs)
	if err != nil {
		return nil, fmt.Errorf("reading the GPT with %d-byte sectors: %w", lbs, err)
	}
	out := &PartitionTable{FromBackup: t.RecoveredFromBackup}
	for _, p := range t.Partitions {
		out.Partitions = append(out.Partitions, Partition{
			Index: p.Index, Type: strings.ToUpper(string(p.Type)), GUID: strings.ToUpper(p.GUID), Name: p.Name,
			Start: int64(p.Start) * int64(lbs), Size: int64(p.Size),
		})
	}
	return out, nil
}

// readOnly hands go-diskfs the file as a backend.File and nothing that writes.
type readOnly struct{ f *os.File }

func (r readOnly) Stat() (os.FileInfo, error)                { return r.f.Stat() }
func (r readOnly) Read(b []byte) (int, error)                { return r.f.Read(b) }
func (r readOnly) Close() error                              { return nil }
func (r readOnly) ReadAt(b []byte, off int64) (int, error)   { return r.f.ReadAt(b, off) }
func (r readOnly) Seek(off int64, whence int) (int64, error) { return r.f.Seek(off, whence) }

var _ backend.File = readOnly{}

type gptHeader struct{ entries, entrySize uint32 }

// gptHeaderAt reads the counts of a GPT header at off, or nil when off holds no "EFI
// PART" signature.
func gptHeaderAt(r io.ReaderAt, off int64) (*gptHeader, error) {
	if off < 0 {
		return nil, nil
	}
	b := make([]byte, 92)
	if _, err := r.ReadAt(b, off); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	if !bytes.Equal(b[:8], []byte("EFI PART")) {
		return nil, nil
	}
	return &gptHeader{entries: binary.LittleEndian.Uint32(b[80:84]), entrySize: binary.LittleEndian.Uint32(b[84:88])}, nil
}

// newTable is the GPT Ensure writes on an empty disk of size bytes: a protective MBR and
// one partition of PartitionType named for cluster, from DataOffset to the last whole
// MiB before the backup entry array. Sectors are the disk's logical block size (512 or
// 4096: a 4Kn drive's GPT counts 4 KiB sectors).
func newTable(size int64, lbs, pbs int, cluster ClusterID) (*gpt.Table, error) {
	if lbs != 512 && lbs != 4096 {
		return nil, fmt.Errorf("logical block size %d: gpurack writes GPTs for 512 and 4096", lbs)
	}
	sectors := size / int64(lbs)
	entrySectors := int64(128*gpt.PartitionEntrySize) / int64(lbs)
	lastUsable := sectors - 1 - entrySectors - 1 // backup header, backup entries
	endByte := ((lastUsable + 1) * int64(lbs)) &^ (DataOffset - 1)
	if endByte-DataOffset < 16*DataOffset {
		return nil, fmt.Errorf("the disk has %d bytes; a data disk needs at least 18 MiB", size)
	}
	return &gpt.Table{
		LogicalSectorSize:  lbs,
		PhysicalSectorSize: pbs,
		ProtectiveMBR:      true,
		Partitions: []*gpt.Partition{{
			Index: 1,
			Start: uint64(DataOffset / lbs),
			End:   uint64(endByte/int64(lbs)) - 1,
			Type:  gpt.Type(PartitionType),
			Name:  cluster.partitionName(),
		}},
	}, nil
}

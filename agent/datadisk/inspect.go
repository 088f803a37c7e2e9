package datadisk

import (
	"context"
	"fmt"
	"io"
	"os"
)

// HeadBytes and TailBytes are how much of a disk's start and end Inspect reads raw, and
// Wipe zeroes: the first MiB (partition tables, LVM, RAID 1.1/1.2, ZFS L0/L1, most
// superblocks) and the first MiB of where gpurack's partition would start (a filesystem
// left in a partition at the usual 1 MiB); the last 2 MiB (the backup GPT, RAID
// 0.90/1.0 and ZFS L2/L3 of the disk, and those of a last partition that ended there).
const (
	HeadBytes = DataOffset + 1<<20
	TailBytes = 2 << 20
)

// Evidence is everything Inspect read from a disk, as plain data: Decide's input.
type Evidence struct {
	Path             string
	Size             int64 // bytes, as the device reports it when opened
	LogicalBlockSize int
	// Whole is blkid's probe of the whole device; AtData its probe at DataOffset, to the
	// end of gpurack's partition or of the disk.
	Whole, AtData Probe
	// Table is the GPT as go-diskfs read it (nil: no GPT signature); TableError says why
	// a GPT with a signature could not be read.
	Table      *PartitionTable
	TableError string
	// Head is the disk's first HeadBytes (or all of a smaller disk), Tail the last
	// TailBytes, which start at TailOffset.
	Head, Tail []byte
	TailOffset int64
}

// Inspect reads what is on d without writing to it: the device is opened read-only and
// blkid's low-level probe only reads. ctx bounds the blkid runs.
func Inspect(ctx context.Context, d Disk) (Evidence, error) {
	f, err := os.Open(d.Path)
	if err != nil {
		return Evidence{}, fmt.Errorf("inspect %s: %w", d.Path, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return Evidence{}, fmt.Errorf("inspect %s: size: %w", d.Path, err)
	}
	lbs := d.LogicalBlockSize
	if lbs == 0 {
		lbs = 512
	}
	pbs := max(d.PhysicalBlockSize, lbs)
	ev := Evidence{Path: d.Path, Size: size, LogicalBlockSize: lbs}
	if ev.Head, err = readAt(f, 0, min(size, HeadBytes)); err != nil {
		return Evidence{}, fmt.Errorf("inspect %s: %w", d.Path, err)
	}
	ev.TailOffset = max(size-TailBytes, 0)
	if ev.Tail, err = readAt(f, ev.TailOffset, size-ev.TailOffset); err != nil {
		return Evidence{}, fmt.Errorf("inspect %s: %w", d.Path, err)
	}
	if ev.Table, err = readGPT(f, size, lbs, pbs); err != nil {
		ev.TableError = err.Error()
	}
	if ev.Whole, err = probeBlkid(ctx, d.Path, 0, 0); err != nil {
		return Evidence{}, fmt.Errorf("inspect %s: %w", d.Path, err)
	}
	if size > DataOffset {
		dataSize := size - DataOffset
		if p, ok := ev.dataPartition(); ok {
			dataSize = p.Size
		}
		if ev.AtData, err = probeBlkid(ctx, d.Path, DataOffset, dataSize); err != nil {
			return Evidence{}, fmt.Errorf("inspect %s: %w", d.Path, err)
		}
	}
	return ev, nil
}

// dataPartition returns the table's only partition when it is gpurack's: the right type,
// a gpurack name, starting at DataOffset.
func (ev Evidence) dataPartition() (Partition, bool) {
	if ev.Table == nil || len(ev.Table.Partitions) != 1 {
		return Partition{}, false
	}
	p := ev.Table.Partitions[0]
	if p.Type != PartitionType || p.Start != DataOffset {
		return Partition{}, false
	}
	if _, ok := fingerprintFromName(p.Name); !ok {
		return Partition{}, false
	}
	return p, true
}

func readAt(f *os.File, off, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("read %d bytes at offset %d: %w", n, off, err)
	}
	return b, nil
}

package datadisk

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// State is what a disk is to gpurack.
type State int

const (
	// Empty: nothing anyone wrote was found; Ensure may partition and format it.
	Empty State = iota
	// Ours: gpurack's partition for this cluster. Ensure mounts it as it is; it formats
	// the partition only when it is still blank (Verdict.Formatted false), as a
	// preparation cut short leaves it.
	Ours
	// OtherCluster: gpurack's partition, for another cluster. Refused.
	OtherCluster
	// Foreign: something gpurack did not make. Refused.
	Foreign
)

func (s State) String() string {
	switch s {
	case Empty:
		return "empty"
	case Ours:
		return "ours"
	case OtherCluster:
		return "other-cluster"
	case Foreign:
		return "foreign"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Verdict is Decide's answer for one disk.
type Verdict struct {
	State State
	// Found says what is on the disk, in words for an operator: for a refusal, why
	// ("ext4 filesystem", "GPT partition table with 2 partitions", "gpurack data
	// disk of another cluster (fingerprint 0123456789abcdef)"); for Ours, the partition.
	Found []string
	// Partition is gpurack's data partition (Ours and OtherCluster).
	Partition Partition
	// Formatted is set for Ours when the partition holds gpurack's XFS filesystem.
	Formatted bool
}

// Refused reports whether gpurack must not write to the disk.
func (v Verdict) Refused() bool { return v.State == OtherCluster || v.State == Foreign }

// Reason is Found as one line.
func (v Verdict) Reason() string { return strings.Join(v.Found, "; ") }

func (v Verdict) String() string {
	if len(v.Found) == 0 {
		return v.State.String()
	}
	return v.State.String() + ": " + v.Reason()
}

// Decide says what a disk is from what Inspect read, and so whether gpurack may write to
// it. It is conservative: anything it cannot account for is Foreign. In order:
//
//  1. blkid found signatures on the whole device (a filesystem, LVM, RAID, ZFS, LUKS,
//     several at once), or a partition table that is not exactly gpurack's one
//     partition: Foreign, naming each.
//  2. gpurack's one partition: OtherCluster when its name carries another cluster's
//     fingerprint; otherwise Ours if it holds XFS, or nothing at all in its first MiB
//     (formatting was cut short), and Foreign if it holds anything else.
//  3. No partition table and no signature: a signature where gpurack's partition would
//     start is Foreign; so is any non-zero byte in Head or Tail ("unknown data at
//     offset N"), the backstop for what blkid does not know. Otherwise Empty.
func Decide(ev Evidence, cluster ClusterID) Verdict {
	var found []string
	if ev.Whole.Ambivalent {
		found = append(found, "several signatures on the whole disk (blkid: ambivalent result; wipefs -n lists them)")
	}
	if t := ev.Whole.Fields["TYPE"]; t != "" {
		found = append(found, describeSignature(ev.Whole.Fields))
	}
	ptType := ev.Whole.Fields["PTTYPE"]
	hasTable := ptType != "" || ev.Table != nil || ev.TableError != ""
	part, ours := ev.dataPartition()
	if hasTable && !(ours && ptType == "gpt" && !ev.Table.FromBackup) {
		found = append(found, describeTable(ev, ptType))
	}
	if len(found) > 0 {
		return Verdict{State: Foreign, Found: found}
	}

	if ours {
		fp, _ := fingerprintFromName(part.Name)
		if fp != cluster.Fingerprint() {
			return Verdict{State: OtherCluster, Partition: part,
				Found: []string{fmt.Sprintf("gpurack data disk of another cluster (fingerprint %s; this cluster's is %s)", fp, cluster.Fingerprint())}}
		}
		at := fmt.Sprintf("gpurack data partition %d (%s)", part.Index, part.GUID)
		switch {
		case ev.AtData.Fields["TYPE"] == "xfs" && !ev.AtData.Ambivalent:
			return Verdict{State: Ours, Partition: part, Formatted: true, Found: []string{at + " with an XFS filesystem"}}
		case ev.AtData.Found():
			return Verdict{State: Foreign, Partition: part, Found: []string{at + " holding " + describeProbe(ev.AtData)}}
		}
		if off, ok := firstNonZero(ev.Head, DataOffset, 0); ok {
			return Verdict{State: Foreign, Partition: part, Found: []string{fmt.Sprintf("%s holding unknown data at offset %d", at, off)}}
		}
		return Verdict{State: Ours, Partition: part, Found: []string{at + ", not yet formatted"}}
	}

	if ev.AtData.Found() {
		return Verdict{State: Foreign, Found: []string{fmt.Sprintf("%s at offset %d", describeProbe(ev.AtData), DataOffset)}}
	}
	if off, ok := firstNonZero(ev.Head, 0, 0); ok {
		return Verdict{State: Foreign, Found: []string{fmt.Sprintf("unknown data at offset %d", off)}}
	}
	if off, ok := firstNonZero(ev.Tail, 0, ev.TailOffset); ok {
		return Verdict{State: Foreign, Found: []string{fmt.Sprintf("unknown data at offset %d", off)}}
	}
	return Verdict{State: Empty}
}

// describeProbe names what one blkid probe found.
func describeProbe(p Probe) string {
	if p.Ambivalent {
		return "several signatures (blkid: ambivalent result)"
	}
	if p.Fields["TYPE"] != "" {
		return describeSignature(p.Fields)
	}
	if pt := p.Fields["PTTYPE"]; pt != "" {
		return pt + " partition table"
	}
	return "a signature blkid names no type for"
}

// describeSignature names a blkid TYPE in an operator's words, with its label.
func describeSignature(f map[string]string) string {
	t := f["TYPE"]
	var s string
	switch t {
	case "LVM2_member":
		s = "LVM2 physical volume"
	case "linux_raid_member":
		s = "Linux RAID member"
	case "zfs_member":
		s = "ZFS member"
	case "crypto_LUKS":
		s = "LUKS encrypted volume"
	case "swap":
		s = "swap area"
	case "bcache":
		s = "bcache device"
	case "ceph_bluestore":
		s = "Ceph BlueStore device"
	default:
		if f["USAGE"] == "filesystem" {
			s = t + " filesystem"
		} else {
			s = t + " signature"
		}
	}
	if l := f["LABEL"]; l != "" {
		what := "label"
		switch t {
		case "zfs_member":
			what = "pool"
		case "linux_raid_member":
			what = "array"
		}
		s += fmt.Sprintf(" (%s %q)", what, l)
	}
	return s
}

// describeTable names a partition table gpurack did not make.
func describeTable(ev Evidence, ptType string) string {
	switch {
	case ev.Table != nil && ev.Table.FromBackup:
		return fmt.Sprintf("GPT partition table with %s, read from its backup (the primary is damaged)", plural(len(ev.Table.Partitions), "partition"))
	case ev.Table != nil:
		return fmt.Sprintf("GPT partition table with %s", plural(len(ev.Table.Partitions), "partition"))
	case ev.TableError != "":
		return "GPT partition table that cannot be read (" + ev.TableError + ")"
	case ptType == "dos":
		return fmt.Sprintf("MBR partition table with %s", plural(mbrPartitions(ev.Head), "partition"))
	case ptType == "PMBR":
		return "protective MBR without a readable GPT"
	case ptType == "gpt":
		return "GPT partition table"
	}
	return ptType + " partition table"
}

// mbrPartitions counts the used entries of the MBR in head's first sector.
func mbrPartitions(head []byte) int {
	if len(head) < 512 {
		return 0
	}
	n := 0
	for i := range 4 {
		e := head[446+16*i : 446+16*(i+1)]
		if e[4] != 0 && binary.LittleEndian.Uint32(e[12:16]) != 0 { // type, sector count
			n++
		}
	}
	return n
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// firstNonZero returns the disk offset of the first non-zero byte of b from index from,
// b starting at disk offset base.
func firstNonZero(b []byte, from int, base int64) (int64, bool) {
	for i := from; i < len(b); i++ {
		if b[i] != 0 {
			return base + int64(i), true
		}
	}
	return 0, false
}

package datadisk

import (
	"strings"
	"testing"
)

const (
	testCluster  ClusterID = "cluster-a"
	otherCluster ClusterID = "cluster-b"
)

// evidence is a blank 1 GiB disk as Inspect would read it; the options change it.
func evidence(opts ...func(*Evidence)) Evidence {
	ev := Evidence{Path: "/dev/nvme0n1", Size: 1 << 30, LogicalBlockSize: 512,
		Head: make([]byte, HeadBytes), Tail: make([]byte, TailBytes), TailOffset: 1<<30 - TailBytes}
	for _, o := range opts {
		o(&ev)
	}
	return ev
}

func whole(kv ...string) func(*Evidence) {
	return func(ev *Evidence) { ev.Whole = probe(kv...) }
}

func atData(kv ...string) func(*Evidence) {
	return func(ev *Evidence) { ev.AtData = probe(kv...) }
}

func probe(kv ...string) Probe {
	p := Probe{Fields: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Fields[kv[i]] = kv[i+1]
	}
	return p
}

// ourTable is gpurack's GPT for cluster: the whole-disk probe says gpt, the table has
// the one partition.
func ourTable(cluster ClusterID) func(*Evidence) {
	return func(ev *Evidence) {
		ev.Whole = probe("PTTYPE", "gpt", "PTUUID", "5e0d9a7c-0000-4000-8000-000000000001")
		ev.Table = &PartitionTable{Partitions: []Partition{{Index: 1, Type: PartitionType, GUID: "0F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F0",
			Name: cluster.partitionName(), Start: DataOffset, Size: 1<<30 - 2*DataOffset}}}
		ev.Head[0x1fe], ev.Head[0x1ff] = 0x55, 0xaa // protective MBR
		ev.Tail[TailBytes-512] = 'E'                // backup header
	}
}

func setByte(off int64, v byte) func(*Evidence) {
	return func(ev *Evidence) {
		if off >= ev.TailOffset {
			ev.Tail[off-ev.TailOffset] = v
		} else {
			ev.Head[off] = v
		}
	}
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ev        Evidence
		state     State
		formatted bool
		found     string // a part of Reason
	}{
		{"blank disk", evidence(), Empty, false, ""},
		{"ext4 on the whole disk", evidence(whole("TYPE", "ext4", "USAGE", "filesystem", "LABEL", "scratch")), Foreign, false, `ext4 filesystem (label "scratch")`},
		{"xfs on the whole disk is not ours", evidence(whole("TYPE", "xfs", "USAGE", "filesystem")), Foreign, false, "xfs filesystem"},
		{"LVM", evidence(whole("TYPE", "LVM2_member", "USAGE", "raid")), Foreign, false, "LVM2 physical volume"},
		{"RAID", evidence(whole("TYPE", "linux_raid_member", "USAGE", "raid", "LABEL", "host:0")), Foreign, false, `Linux RAID member (array "host:0")`},
		{"ZFS", evidence(whole("TYPE", "zfs_member", "USAGE", "raid", "LABEL", "tank")), Foreign, false, `ZFS member (pool "tank")`},
		{"LUKS", evidence(whole("TYPE", "crypto_LUKS", "USAGE", "crypto")), Foreign, false, "LUKS encrypted volume"},
		{"unknown type", evidence(whole("TYPE", "frob", "USAGE", "other")), Foreign, false, "frob signature"},
		{"ambivalent", evidence(func(ev *Evidence) { ev.Whole = Probe{Ambivalent: true} }), Foreign, false, "several signatures"},
		{"MBR", evidence(whole("PTTYPE", "dos"), func(ev *Evidence) {
			e := ev.Head[446:]
			e[4], e[12] = 0x83, 0x10
		}), Foreign, false, "MBR partition table with 1 partition"},
		{"GPT of two partitions", evidence(whole("PTTYPE", "gpt"), func(ev *Evidence) {
			ev.Table = &PartitionTable{Partitions: []Partition{{Index: 1, Type: "0FC63DAF-8483-4772-8E79-3D69D8477DE4"}, {Index: 2}}}
		}), Foreign, false, "GPT partition table with 2 partitions"},
		{"our partition beside another", evidence(ourTable(testCluster), func(ev *Evidence) {
			ev.Table.Partitions = append(ev.Table.Partitions, Partition{Index: 2, Type: "0FC63DAF-8483-4772-8E79-3D69D8477DE4"})
		}), Foreign, false, "GPT partition table with 2 partitions"},
		{"our type at another offset", evidence(ourTable(testCluster), func(ev *Evidence) { ev.Table.Partitions[0].Start = 2 * DataOffset }), Foreign, false, "GPT partition table with 1 partition"},
		{"our type with a name not ours", evidence(ourTable(testCluster), func(ev *Evidence) { ev.Table.Partitions[0].Name = "data" }), Foreign, false, "GPT partition table with 1 partition"},
		{"our table read from the backup", evidence(ourTable(testCluster), func(ev *Evidence) { ev.Table.FromBackup = true }), Foreign, false, "primary is damaged"},
		{"GPT that cannot be read", evidence(whole("PTTYPE", "gpt"), func(ev *Evidence) { ev.TableError = "bad CRC" }), Foreign, false, "cannot be read (bad CRC)"},
		{"GPT go-diskfs reads and blkid does not", evidence(ourTable(testCluster), whole()), Foreign, false, "GPT partition table with 1 partition"},
		{"protective MBR without GPT", evidence(whole("PTTYPE", "PMBR")), Foreign, false, "protective MBR without a readable GPT"},
		{"a filesystem beside our table", evidence(ourTable(testCluster), func(ev *Evidence) { ev.Whole.Fields["TYPE"] = "vfat"; ev.Whole.Fields["USAGE"] = "filesystem" }), Foreign, false, "vfat filesystem"},
		{"ours, formatted", evidence(ourTable(testCluster), atData("TYPE", "xfs", "USAGE", "filesystem")), Ours, true, "with an XFS filesystem"},
		{"ours, not yet formatted", evidence(ourTable(testCluster)), Ours, false, "not yet formatted"},
		{"ours, holding ext4", evidence(ourTable(testCluster), atData("TYPE", "ext4", "USAGE", "filesystem")), Foreign, false, "holding ext4 filesystem"},
		{"ours, holding several", evidence(ourTable(testCluster), func(ev *Evidence) { ev.AtData = Probe{Ambivalent: true} }), Foreign, false, "holding several signatures"},
		{"ours, holding unknown data", evidence(ourTable(testCluster), setByte(DataOffset+4096, 1)), Foreign, false, "holding unknown data at offset 1052672"},
		{"another cluster's", evidence(ourTable(otherCluster), atData("TYPE", "xfs")), OtherCluster, false, "another cluster (fingerprint " + otherCluster.Fingerprint()},
		{"a filesystem where our partition would start", evidence(atData("TYPE", "ext4", "USAGE", "filesystem")), Foreign, false, "ext4 filesystem at offset 1048576"},
		{"a byte in the first MiB", evidence(setByte(4096, 0xff)), Foreign, false, "unknown data at offset 4096"},
		{"a byte in the second MiB", evidence(setByte(DataOffset+17, 1)), Foreign, false, "unknown data at offset 1048593"},
		{"a byte in the last MiB", evidence(setByte(1<<30-1, 1)), Foreign, false, "unknown data at offset 1073741823"},
		{"a small disk", func() Evidence {
			ev := evidence()
			ev.Size, ev.Head, ev.Tail, ev.TailOffset = 4096, make([]byte, 4096), make([]byte, 4096), 0
			ev.Tail[4095] = 1
			return ev
		}(), Foreign, false, "unknown data at offset 4095"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Decide(tc.ev, testCluster)
			if v.State != tc.state || v.Formatted != tc.formatted || !strings.Contains(v.Reason(), tc.found) {
				t.Errorf("Decide = %v (formatted %v), want %v (formatted %v) with %q", v, v.Formatted, tc.state, tc.formatted, tc.found)
			}
			if v.Refused() != (tc.state == Foreign || tc.state == OtherCluster) {
				t.Errorf("Refused() = %v for %v", v.Refused(), v.State)
			}
			if v.Refused() && v.Reason() == "" {
				t.Error("a refusal that says nothing")
			}
		})
	}
}

func TestFingerprintAndName(t *testing.T) {
	name := testCluster.partitionName()
	if len(name) > 36 {
		t.Fatalf("%q does not fit a GPT name", name)
	}
	fp, ok := fingerprintFromName(name)
	if !ok || fp != testCluster.Fingerprint() || fp == otherCluster.Fingerprint() {
		t.Errorf("fingerprint %q %v", fp, ok)
	}
	for _, bad := range []string{"gpurack-data-", "gpurack-data-0123456789ABCDEF", "gpurack-data-0123456789abcdeg", "gpurack-data-0123456789abcdef0", "data"} {
		if _, ok := fingerprintFromName(bad); ok {
			t.Errorf("%q read as gpurack's", bad)
		}
	}
	if ClusterID(" ").validate() == nil || testCluster.validate() != nil {
		t.Error("validate")
	}
}

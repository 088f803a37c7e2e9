// Package datadisk decides which of a node's local disks gpurack may use as data disks,
// and prepares them: one GPT partition of gpurack's own type carrying the cluster's
// fingerprint, an XFS filesystem with project quotas on it, mounted at a fixed path.
//
// The rule it exists to keep: the agent never writes to a disk that holds anything it did
// not make. A disk is inspected read-only (Inspect: blkid's low-level probe of the whole
// device and of where gpurack's partition starts, the GPT read with go-diskfs, and the raw
// first and last 2 MiB), and a pure function (Decide) turns what was read into a
// Verdict: Empty (may be prepared), Ours (this cluster's; mounted as it is, never formatted
// again), OtherCluster or Foreign (refused, with what was found). Ensure acts only on Empty
// and Ours; Wipe, the one way to make a refused disk usable, needs the disk's serial as
// confirmation and is meant to be run only on an operator's audited request.
//
// The flow, in order of use:
//
//	Discover (sysfs) → Select (the profile's rules, internal/disksel) → Inspect → Decide → Ensure
//
// What it is not for: it does not choose volumes for pods (the provisioner does, with
// project quotas on the mounted filesystem), does not report refusals anywhere (the agent
// puts Verdicts into its facts, the rack report and events), and does not decide when a
// wipe is allowed (gpuboot records the operator's request; the agent calls Wipe). It
// never creates RAID, LVM or multi-partition layouts. docs/storage.md states the disk
// rules; a decision record in docs/decisions says why the cluster is carried in the
// partition name.
package datadisk

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/gpurack/gpurack/internal/localvol"
)

// PartitionType is the GPT partition type GUID of a gpurack data partition. It was drawn
// at random once (issue 28) and never changes: a partition of this type on a disk means
// gpurack made it. It is registered nowhere else; `lsblk -o PARTTYPE` shows it.
const PartitionType = "9F79C4FC-77AC-4DBE-8AFD-F86C2FB9507B"

// PartitionNamePrefix begins the GPT name of a gpurack data partition; the cluster's
// Fingerprint follows it ("gpurack-data-0123456789abcdef", 29 of the 36 UTF-16 code
// units a GPT name holds). `lsblk -o PARTLABEL` shows it.
const PartitionNamePrefix = "gpurack-data-"

// FilesystemLabel is the XFS label Ensure gives the filesystem (XFS labels hold 12 bytes).
const FilesystemLabel = "gpurack-data"

// DataOffset is where the data partition starts, in bytes: 1 MiB, a multiple of every
// logical and physical block size and of common erase-block sizes.
const DataOffset = 1 << 20

// DefaultMountRoot is the directory under which Ensure mounts each data disk, at
// DefaultMountRoot/<partition GUID in lower case>.
const DefaultMountRoot = localvol.MountRoot

// ClusterID names the cluster a data disk belongs to. It is opaque here: any non-empty
// string that is the same on every node of one cluster and different between clusters
// (the agent's wiring is to pass the cluster CA's SHA-256 fingerprint). Only
// its Fingerprint is written to a disk.
type ClusterID string

// Fingerprint is the first 8 bytes of the SHA-256 of the cluster id, in lower-case hex:
// what a disk carries in its partition name.
func (c ClusterID) Fingerprint() string {
	sum := sha256.Sum256([]byte(c))
	return hex.EncodeToString(sum[:8])
}

// partitionName is the GPT name of c's data partition.
func (c ClusterID) partitionName() string { return PartitionNamePrefix + c.Fingerprint() }

// validate says what is wrong with c for use on a disk.
func (c ClusterID) validate() error {
	if strings.TrimSpace(string(c)) == "" {
		return fmt.Errorf("datadisk: the cluster id is empty; pass the cluster's stable id (the cluster CA's SHA-256 fingerprint)")
	}
	return nil
}

// fingerprintFromName returns the fingerprint in a gpurack partition name, and whether
// name is one.
func fingerprintFromName(name string) (string, bool) {
	fp, ok := strings.CutPrefix(name, PartitionNamePrefix)
	if !ok || len(fp) != 16 {
		return "", false
	}
	if _, err := hex.DecodeString(fp); err != nil || strings.ToLower(fp) != fp {
		return "", false
	}
	return fp, true
}

// Package sharedvol names, once, what gpurack's shared volumes (the gpurack-shared
// StorageClass, docs/storage.md, decision 0677) put in the cluster and on the NFS
// export: the provisioner name, the StorageClass and its parameters, the claim
// annotation of a read-only view, the export's layout and the lease the agents elect
// their one provisioner by. controlplane-bootstrap creates the StorageClass, RBAC and
// admission rules under these names; the agents provision under them
// (agent/sharedpv); `gpuboot nfs-exports` writes the storage host's exports.
//
// It holds names, and the checks of a directory name on the export that both sides
// make.
package sharedvol

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

const (
	// Provisioner is the StorageClass provisioner and the value of a volume's
	// pv.kubernetes.io/provisioned-by.
	Provisioner = "shared.gpurack.io"
	// StorageClass is the class controlplane-bootstrap creates when the cluster has an
	// NFS export (init --nfs-export): Immediate binding, reclaim Delete, archived on
	// delete.
	StorageClass = "gpurack-shared"
	// Lease names the ConfigMap, in localvol.Namespace (gpurack-storage), that holds
	// the election record by which the nodes' agents elect the one that provisions
	// shared volumes (a ConfigMap: NodeRestriction lets a node hold no Lease but its
	// own heartbeat).
	Lease = "shared-gpurack-io-leader"
	// LabelView is on a read-only view's PersistentVolume: the name of the volume
	// whose directory it shows.
	LabelView = "gpurack.io/shared-view-of"
)

// StorageClass parameters.
const (
	// ParamServer is the NFS server's address (a host name or IP address).
	ParamServer = "server"
	// ParamShare is the exported directory, absolute ("/srv/gpurack").
	ParamShare = "share"
	// ParamOnDelete says what happens to a volume's directory when its volume is
	// deleted (reclaim Delete): "archive" (the default) moves it under ArchiveDir,
	// "delete" removes it.
	ParamOnDelete = "onDelete"
	// ParamDirectoryMode is the octal mode of a new volume's directory ("0777" when
	// absent).
	ParamDirectoryMode = "directoryMode"
)

// OnDelete values.
const (
	OnDeleteArchive = "archive"
	OnDeleteDelete  = "delete"
)

// AnnViewOf, on a claim that asks for ReadOnlyMany only, names a claim of the same
// namespace whose gpurack-shared volume the new one shows, read-only: written once
// through that claim, then mounted read-only by many pods. Without it a
// ReadOnlyMany claim gets a new, empty directory.
const AnnViewOf = "gpurack.io/shared-view-of"

// The export's layout: each volume's directory is <share>/VolumesDir/<DirName>; an
// archived one moves to <share>/ArchiveDir/<DirName>.<UTC time>.
const (
	VolumesDir = "volumes"
	ArchiveDir = "archived"
)

// MountRoot is where the provisioning agent mounts an export, under a directory
// named for its server and share (MountDir).
const MountRoot = "/run/gpurack/shared"

// dirName is what DirName makes: namespace_claim_volume. Namespaces and claim names
// are DNS subdomains or labels and PV names too, none holding '_', so the three parts
// read back unambiguously.
var dirName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?_[a-z0-9]([-a-z0-9.]*[a-z0-9])?_[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// DirName is the directory of volume pv, provisioned for claim namespace/name: its
// name says whose it is to whoever reads the export (a backup, a restore).
func DirName(namespace, claim, pv string) string {
	return namespace + "_" + claim + "_" + pv
}

// CheckDirName refuses a directory name DirName could not have made for volume pv:
// the one check between a PersistentVolume's path and anything removed or moved on
// the export.
func CheckDirName(name, pv string) error {
	if len(name) > 255 || !dirName.MatchString(name) {
		return fmt.Errorf("%q is not a gpurack-shared volume directory (namespace_claim_volume)", name)
	}
	if !strings.HasSuffix(name, "_"+pv) {
		return fmt.Errorf("directory %q is not volume %s's (its name must end in _%s)", name, pv, pv)
	}
	return nil
}

// CheckShare refuses a share that is not a clean absolute path other than "/".
func CheckShare(share string) error {
	if share == "" || !path.IsAbs(share) || path.Clean(share) != share || share == "/" || strings.ContainsAny(share, "\x00,\n ") {
		return fmt.Errorf("share %q: want the exported directory as a clean absolute path such as /srv/gpurack (not / itself)", share)
	}
	return nil
}

// CheckServer refuses a server that cannot be a host name or an IP address.
func CheckServer(server string) error {
	if server == "" || len(server) > 253 || strings.ContainsAny(server, "/:,\x00 \n") {
		return fmt.Errorf("server %q: want the NFS server's host name or IPv4 address, without a port or path", server)
	}
	return nil
}

// VolumePath is the NFS path of a volume's directory on the server.
func VolumePath(share, dir string) string { return share + "/" + VolumesDir + "/" + dir }

// MountDir is where the provisioning agent mounts server:share.
func MountDir(server, share string) string {
	return MountRoot + "/" + strings.NewReplacer("/", "_").Replace(server+share)
}

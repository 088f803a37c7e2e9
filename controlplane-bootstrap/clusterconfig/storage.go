package clusterconfig

import (
	"slices"
	"strings"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// Storage configures the cluster's shared storage. Node-local volumes
// (gpurack-local) need no configuration here: the node images' profiles and gpuboot
// say which disks are data disks.
type Storage struct {
	// NFS is the storage host's export for gpurack-shared (docs/storage.md); none:
	// the cluster has no gpurack-shared class.
	NFS *NFS `yaml:"nfs"`
}

// NFS is one NFS export, set up on its storage host with `gpuboot nfs-exports`. The
// cluster's agents provision gpurack-shared volumes as directories under it.
type NFS struct {
	// Server is the storage host's address or DNS name, as the nodes reach it.
	Server string `yaml:"server"`
	// Share is the exported directory, absolute (/srv/gpurack).
	Share string `yaml:"share"`
	// MountOptions are the options every gpurack-shared volume is mounted with
	// (the class's mountOptions); default DefaultNFSMountOptions.
	MountOptions []string `yaml:"mountOptions"`
	// OnDelete is what happens to a deleted volume's directory: archive (default)
	// or delete.
	OnDelete string `yaml:"onDelete"`
}

// DefaultNFSMountOptions: NFS 4.1 over TCP (one port, 2049; no rpcbind or statd);
// soft, with each try 10 s (timeo=100) and 2 retransmissions, so a server that stops
// answering fails a pod's I/O with EIO after about a minute (10 + 20 + 30 s) instead
// of leaving it, kubelet's volume statistics and the provisioner hung for as long as
// the server is down. Not noresvport: the client keeps a reserved source port, which a
// Debian server's exports require by default (`secure`). The cost of soft: a write the server never acknowledged fails rather
// than waits, so a job must check its writes (fsync, close) to know its checkpoint is
// whole, as the test probe's training does (write, fsync, rename). A new pod's mount
// fails after mount.nfs's own retries (2 minutes) with kubelet's FailedMount event,
// and kubelet tries again with backoff. docs/storage.md, decision 0677.
var DefaultNFSMountOptions = []string{"nfsvers=4.1", "soft", "timeo=100", "retrans=2"}

func (s *Storage) applyDefaults() {
	if s.NFS == nil {
		return
	}
	if len(s.NFS.MountOptions) == 0 {
		s.NFS.MountOptions = slices.Clone(DefaultNFSMountOptions)
	}
	if s.NFS.OnDelete == "" {
		s.NFS.OnDelete = sharedvol.OnDeleteArchive
	}
}

func (s *Storage) validate(p *problems) {
	n := s.NFS
	if n == nil {
		return
	}
	if err := sharedvol.CheckServer(n.Server); err != nil {
		p.add("storage.nfs.server", "%v", err)
	}
	if err := sharedvol.CheckShare(n.Share); err != nil {
		p.add("storage.nfs.share", "%v", err)
	}
	if n.OnDelete != sharedvol.OnDeleteArchive && n.OnDelete != sharedvol.OnDeleteDelete {
		p.add("storage.nfs.onDelete", "%q: write %s (move a deleted volume's directory under %s/) or %s", n.OnDelete, sharedvol.OnDeleteArchive, sharedvol.ArchiveDir, sharedvol.OnDeleteDelete)
	}
	for _, o := range n.MountOptions {
		if o == "" || strings.ContainsAny(o, " \t\n") {
			p.add("storage.nfs.mountOptions", "%q is not a mount option (one option per entry, such as nfsvers=4.1)", o)
		}
	}
}

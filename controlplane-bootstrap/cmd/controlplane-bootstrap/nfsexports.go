package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/nfsexport"
)

func newNFSExportsCommand() *cobra.Command {
	var o nfsexport.Options
	var clients []string
	cmd := &cobra.Command{
		Use:   "nfs-exports --share DIR --clients CIDR [--clients CIDR…] [--fsid N] [--dry-run]",
		Short: "Set up this host's NFS export for gpurack-shared (run on the storage host; docs/storage.md)",
		Long: `nfs-exports sets up the storage host's export for the gpurack-shared StorageClass,
with Debian's nfs-kernel-server (apt-get install nfs-kernel-server):
  - makes DIR/volumes (one directory per volume) and DIR/archived (deleted volumes);
  - writes ` + nfsexport.DefaultExportsFile + ` (a file of its own: /etc/exports is left
    alone) exporting DIR to the clients' networks with
    rw,sync,no_subtree_check,no_root_squash,sec=sys (why each: docs/storage.md);
  - runs exportfs -ra to load it.
Run it again to change the clients; it rewrites its own file only.

Then name the export in cluster.yaml and run init again:
  storage:
    nfs: {server: ADDRESS-OF-THIS-HOST, share: DIR}

The export is a single point of failure with no replication: back it up
(docs/operations.md "Backing up and restoring the NFS export").

--clients must be the nodes' networks only: root on any client is root over the
export. --fsid is needed when DIR is on a filesystem without a UUID (tmpfs).

Examples:
  controlplane-bootstrap nfs-exports --share /srv/gpurack --clients 10.10.0.0/16 --dry-run
  controlplane-bootstrap nfs-exports --share /srv/gpurack --clients 10.10.0.0/16 --clients 10.11.0.0/16`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, c := range clients {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return fmt.Errorf("--clients %q: want a network such as 10.10.0.0/16: %w", c, err)
				}
				o.Clients = append(o.Clients, p)
			}
			o.Out = cmd.OutOrStdout()
			return nfsexport.Setup(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Share, "share", "", "the directory to export, absolute (made when missing)")
	f.StringArrayVar(&clients, "clients", nil, "a network whose hosts may mount the export (the nodes'), repeatable")
	f.IntVar(&o.FSID, "fsid", 0, "the export's fsid= (for a filesystem without a UUID, such as tmpfs); 0: none")
	f.StringVar(&o.ExportsFile, "exports-file", nfsexport.DefaultExportsFile, "the exports file to write")
	f.BoolVar(&o.NoReload, "no-reload", false, "write the file but do not run exportfs -ra")
	f.BoolVar(&o.DryRun, "dry-run", false, "print what would be made and written; change nothing")
	_ = cmd.MarkFlagRequired("share")
	_ = cmd.MarkFlagRequired("clients")
	return cmd
}

package main

import (
	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

func newRegistryCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry",
		Short: "Maintain the cluster's image registry (registry in cluster.yaml; docs/registry.md)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newRegistryGCCommand())
	return cmd
}

func newRegistryGCCommand() *cobra.Command {
	var dir string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "gc --dir DIR [--dry-run]",
		Short: "Delete the registry's blobs and untagged manifests that no tag references",
		Long: `gc frees the registry's storage: it runs distribution's
registry garbage-collect --delete-untagged on the registry's configuration
(DIR/config/registry.yml), which deletes every manifest no tag points at and every blob
no remaining manifest references. Deleting a tag or a manifest (through the registry's
API) frees nothing by itself; gc does.

A push while it collects could lose the pushed layers, so:
  - a registry running under this directory's supervisor (init --foreground) or its
    systemd unit (gpurack-registry.service) is restarted read-only first: pulls go on,
    pushes and deletes are refused (HTTP 405) until gc restarts it read-write, which it
    does also when the collection fails;
  - a stopped registry is collected as it is;
  - a registry that answers on its port but runs otherwise is refused: stop it first.

--dry-run lists what would be deleted and deletes nothing; the registry is left as it is.
garbage-collect's full output (each blob marked or deleted) is DIR/logs/registry-gc.log.

Examples:
  controlplane-bootstrap registry gc --dir /var/lib/gpurack/cluster --dry-run
  controlplane-bootstrap registry gc --dir /var/lib/gpurack/cluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := controlplane.CollectGarbage(cmd.Context(), dir, controlplane.GCOptions{DryRun: dryRun, Out: cmd.OutOrStdout()})
			return err
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be deleted; delete nothing and leave the registry as it is")
	return cmd
}

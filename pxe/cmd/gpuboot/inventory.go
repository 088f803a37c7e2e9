package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/server"
)

func newInventoryCommand() *cobra.Command {
	inv := &cobra.Command{Use: "inventory", Short: "Move gpuboot's inventory between its stores"}
	var path, from string
	migrate := &cobra.Command{
		Use:   "migrate --config gpuboot.yaml [--from STATEDIR/inventory.db]",
		Short: "Copy a bbolt inventory into the cluster store, with every machine's history, and check the copy",
		Long: `migrate copies every machine of a bbolt inventory (by default the state directory's
inventory.db), with its whole transition history, into the cluster that
cluster.kubeconfig reaches, as Machine objects (machines.inventory.gpurack.io), and
then reads each one back and compares it, record and history, with the file's.

Stop gpuboot first: a running gpuboot holds the file, and machines enrolling during
the copy would be missed. The file is only read; it stays as a backup. A machine the
cluster already holds identically is skipped, so a migration that stopped half-way can
be run again; one the cluster holds differently stops the migration, naming it, and
nothing is overwritten.

Afterwards set "inventory: {store: cluster}" in gpuboot.yaml and start gpuboot (see
docs/operations.md, "Moving gpuboot to the cluster store").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			if cfg.Cluster.Kubeconfig == "" {
				return fmt.Errorf("%s sets no cluster.kubeconfig: the cluster store is in the cluster it names", path)
			}
			if from == "" {
				from = cfg.InventoryPath()
			}
			src, err := inventory.OpenBolt(from)
			if err != nil {
				return err
			}
			defer src.Close()
			ctx := cmd.Context()
			dst, err := server.OpenClusterStore(ctx, cfg.Cluster.Kubeconfig)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			start := time.Now()
			rep, err := inventory.Migrate(ctx, src, dst, func(done, total int, _ *inventory.Machine) {
				if done%50 == 0 || done == total {
					fmt.Fprintf(out, "%d/%d machines\n", done, total)
				}
			})
			if err != nil {
				return fmt.Errorf("migrate %s: %w", from, err)
			}
			fmt.Fprintf(out, "migrated %s into the cluster in %s: %d machines (%d copied with %d transitions, %d already there), every one read back and identical\n",
				from, time.Since(start).Round(time.Millisecond), rep.Machines, rep.Copied, rep.Transitions, rep.AlreadyThere)
			fmt.Fprintln(out, `next: set "inventory: {store: cluster}" in gpuboot.yaml and start gpuboot; keep the file as a backup`)
			return nil
		},
	}
	migrate.Flags().StringVar(&path, "config", "/etc/gpuboot/gpuboot.yaml", "gpuboot's configuration (its cluster.kubeconfig names the cluster)")
	migrate.Flags().StringVar(&from, "from", "", "the bbolt inventory to copy (default: STATEDIR/inventory.db)")
	inv.AddCommand(migrate)
	return inv
}

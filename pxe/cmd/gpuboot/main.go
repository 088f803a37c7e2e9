// Command gpuboot: Network-boot, enroll and inventory GPU servers. See `gpuboot --help`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gpuboot:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuboot",
		Short: "Network-boot, enroll and inventory GPU servers",
		Long: `gpuboot network-boots new servers (proxyDHCP or full DHCP, TFTP, iPXE, HTTP), enrolls
them under an approval policy, hands approved machines their join secrets once, and
keeps the inventory and the rack commissioning reports.

Set up once with "gpuboot init", run with "gpuboot serve --config gpuboot.yaml", and
manage machines with "gpuboot machines …" and "gpuboot rack report …" (operator
certificate required). See docs/enrollment.md.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newInitCommand(), newCertsCommand(), newServeCommand(), newMachinesCommand(), newRackCommand(), newGossipCommand(), newOperatorsCommand(), newConfigCommand(), newRolloutCommand(), newInventoryCommand())
	return root
}

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
	return &cobra.Command{
		Use:   "gpuboot",
		Short: "Network-boot, enroll and inventory GPU servers",
		Long: `gpuboot network-boots new servers (proxyDHCP or full DHCP, TFTP, iPXE, HTTP), enrolls
them under an approval policy, hands approved machines their join secrets once, and
keeps the inventory and the rack commissioning reports.

Its commands arrive with the gpuboot issue (#4); see docs/ for the design.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
}

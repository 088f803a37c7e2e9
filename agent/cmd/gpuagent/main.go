// Command gpuagent: Validate GPUs, watch XIDs, gossip rack health and join Kubernetes. See `gpuagent --help`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gpuagent:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "gpuagent",
		Short: "Validate GPUs, watch XIDs, gossip rack health and join Kubernetes",
		Long: `gpuagent runs on every gpurack node: it validates the GPUs through NVML, watches XID
errors, gossips health with its rack peers, joins Kubernetes and answers grpcurl.

Its commands arrive with the gpuagent issue (#5); see docs/ for the design.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
}

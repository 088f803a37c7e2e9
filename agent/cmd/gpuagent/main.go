// Command gpuagent: Validate GPUs, watch XIDs, gossip rack health and join Kubernetes. See `gpuagent --help`.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

// exitError carries a process exit status: validate exits 1 on a failed checklist
// and 2 when it cannot run.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func main() {
	err := newRootCommand().Execute()
	var ee *exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(os.Stderr, "gpuagent:", ee.err)
		}
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "gpuagent:", err)
		os.Exit(2)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuagent",
		Short: "Validate GPUs, watch XIDs, gossip rack health and join Kubernetes",
		Long: `gpuagent runs on every gpurack node: it validates the GPUs through NVML, watches XID
errors, gossips health with its rack peers, joins Kubernetes and answers grpcurl.

Without GPUs, --gpu-backend sim:dgxh100 (or sim:dgxa100, sim:dgxh200) runs everything
against go-nvml's mock servers, with faults injected by --fault. See docs/agent.md.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newValidateCommand(), newRunCommand(), newFaultsCommand(), newCDICommand(), newComputeCheckCommand(), newAPILBCommand())
	return root
}

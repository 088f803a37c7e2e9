package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/agent/cdi"
	"github.com/gpurack/gpurack/agent/gpu"
)

func newCDICommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cdi",
		Short: "The node's CDI spec (the GPUs as containers get them)",
	}
	cmd.AddCommand(newCDIGenerateCommand())
	return cmd
}

func newCDIGenerateCommand() *cobra.Command {
	var (
		bf          backendFlags
		dir, devDir string
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Write the CDI spec the agent writes before its device plugin registers, and list its devices",
		Long: `generate writes the node's CDI spec into --output, as the agent's device plugin does
before it first registers with kubelet, and prints the spec's path and its device names.

With --gpu-backend nvml the spec is nvidia-container-toolkit's (pkg/nvcdi, the pinned
version), generated over the node's NVML library and validated by the CDI library:
nvidia.yaml, with a device per GPU by UUID and by index and "all". With
--gpu-backend sim:MODEL it is the simulation's, gpurack-simulated.yaml, over null-device
nodes it makes (as root) under --sim-dev-dir, labelled simulated throughout.

It exits 0 when the spec was written, and 2 when it cannot be: no NVML, a profile or
directory it cannot use, or a spec the CDI library refuses.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, _, b, _, err := bf.open()
			if err != nil {
				return err
			}
			defer b.Close()
			path, _, err := cdi.Write(cmd.Context(), b, cdi.Options{Dir: dir, DevDir: devDir, Log: log, SimGPUs: func() []cdi.GPU {
				var gpus []cdi.GPU
				for _, g := range gpu.Read(b).GPUs {
					gpus = append(gpus, cdi.GPU{UUID: g.UUID, Index: g.Index})
				}
				return gpus
			}})
			if err != nil {
				return &exitError{2, fmt.Errorf("CDI spec not written: %w", err)}
			}
			names, err := cdi.DeviceNames(path)
			if err != nil {
				return &exitError{2, err}
			}
			fmt.Fprintln(cmd.OutOrStdout(), path)
			for _, n := range names {
				fmt.Fprintln(cmd.OutOrStdout(), "  "+n)
			}
			return nil
		},
	}
	bf.register(cmd.Flags())
	cmd.Flags().StringVar(&dir, "output", cdi.Dir, "directory to write the spec into (containerd and nvidia-container-runtime read "+cdi.Dir+")")
	cmd.Flags().StringVar(&devDir, "sim-dev-dir", cdi.SimDevDir, "where the simulation's device nodes go (sim:MODEL only)")
	return cmd
}

package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/report"
	"github.com/gpurack/gpurack/agent/xid"
)

func newValidateCommand() *cobra.Command {
	var (
		bf     backendFlags
		format string
		kmsg   string
		// cudaLibrary is the compute check's libcuda (gpu.compute).
		cudaLibrary string
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Run the commissioning checklist once and exit 0 (pass), 1 (fail) or 2 (cannot run)",
		Long: `validate reads every GPU once, runs the commissioning checklist against the node profile
and prints it. Warnings do not fail it. It exits 0 when no check fails, 1 when one does,
and 2 when it cannot run: no profile, a bad flag, or NVML not available on a node whose
profile expects GPUs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(report.Formats, format) {
				return &exitError{2, fmt.Errorf("--format %q: use %s", format, strings.Join(report.Formats, ", "))}
			}
			log, p, b, s, err := bf.open()
			if err != nil {
				return err
			}
			defer b.Close()
			m := monitor.New(monitor.Config{Backend: b, Profile: p, Log: log, Compute: computeHook(cudaLibrary)})
			if s != nil {
				recordInjectedXIDs(m, bf.faults)
			}
			if kmsg == "auto" {
				kmsg = ""
				if !b.Simulated() {
					kmsg = xid.KmsgPath
				}
			}
			if kmsg != "" && kmsg != "off" {
				if _, err := m.ReadKmsgOnce(kmsg); err != nil {
					log.Warn("kernel log not read; XIDs since boot not checked", "error", err)
				}
			}
			cl := m.RunChecks(monitor.PhaseCommissioning)
			root := facts.Root("/")
			if err := report.Write(cmd.OutOrStdout(), format, cl, root.ReadIdentity(), root.ImageID()); err != nil {
				return &exitError{2, err}
			}
			switch {
			case p.GPU != nil && !cl.Snapshot.Driver.Loaded:
				return &exitError{2, fmt.Errorf("cannot validate GPUs: %s", cl.Snapshot.Driver.Error)}
			case cl.Overall == checks.Fail:
				return &exitError{1, fmt.Errorf("checklist failed")}
			}
			return nil
		},
	}
	bf.register(cmd.Flags())
	cmd.Flags().StringVar(&format, "format", "text", "output format: "+strings.Join(report.Formats, ", "))
	cmd.Flags().StringVar(&cudaLibrary, "cuda-library", "", "path of libcuda.so.1 for the compute check when the profile turns gpu.compute on (default: the dynamic loader's search)")
	cmd.Flags().StringVar(&kmsg, "kmsg", "auto", "kernel log to read XIDs since boot from: a path, off, or auto (/dev/kmsg with the nvml backend)")
	return cmd
}

// recordInjectedXIDs puts --fault xid faults into the XID history: a single run has no
// event watch to receive them.
func recordInjectedXIDs(m *monitor.Monitor, specs []string) {
	for _, e := range injectedXIDs(specs) {
		m.RecordXID(e, 0)
	}
}

// injectedXIDs are the XIDs that --fault xid:VALUE@gpuN emits at start. The simulator
// emits them on its NVML event set before any watch is registered, so, like the XIDs a
// real node finds in its kernel log from before the agent started, they are handed to
// the monitor's history directly.
func injectedXIDs(specs []string) []xid.Event {
	var out []xid.Event
	for _, spec := range specs {
		f, err := sim.ParseFault(spec)
		if err != nil || f.Kind != sim.KindXID {
			continue
		}
		out = append(out, xid.Event{GPU: f.GPU, Code: uint32(f.Value), At: timeNow(), Source: "sim", Simulated: true})
	}
	return out
}

// newFaultsCommand prints the fault grammar.
func newFaultsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "faults",
		Short: "List the simulator's fault kinds and the --fault grammar",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), sim.Grammar())
			fmt.Fprintln(cmd.OutOrStdout(), "\nExamples: --fault xid:79@gpu3 --fault pcie-width:8@gpu1 --fault driver-mismatch")
			_ = os.Stdout.Sync()
		},
	}
}

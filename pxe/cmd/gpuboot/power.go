package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/bmc"
)

const (
	// powerTimeout is `machines power`'s --timeout when not given: a cycle waits for
	// the BMC's task and the power state twice, up to 2 minutes each.
	powerTimeout = 10 * time.Minute
	// powerParallel bounds the machines powered at once.
	powerParallel = 8
)

// newMachinesPowerCommand is `machines power`.
func newMachinesPowerCommand(f *clientFlags) *cobra.Command {
	var reason string
	power := &cobra.Command{
		Use:   "power on|off|cycle|status MACHINE…",
		Short: "Power machines on or off, power-cycle them, or read their power state, through their BMCs (Redfish)",
		Long: `Power machines on or off, power-cycle them, or read their power state, through each
machine's BMC (Redfish; docs/operations.md, "Power control (Redfish)"). gpuboot does it,
with the BMC address from the bmc column of the machine's rack manifest row and the BMC
account for its rack from bmc-credentials.yaml in gpuboot's state directory.

on powers on (Reset On); off powers off at once, without asking the OS to shut down
(ForceOff); cycle power-cycles (PowerCycle, or ForceOff then On where the BMC has no
PowerCycle), and powers on a machine that is off; status only reads. A machine already
in the state asked for is left alone. Each command waits until the BMC reports the new
power state (2 minutes at most per step), then prints the state and what the BMC did;
a failure is reported, never retried. on, off and cycle are recorded in the machine's
history, with --reason. Up to 8 machines are done at once; the exit status is non-zero
when any failed.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			action, err := bmc.ParseAction(args[0])
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("timeout") {
				f.timeout = powerTimeout
			}
			machines := args[1:]
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				outcomes := powerMachines(ctx, c, action, machines, reason)
				return printPower(cmd.OutOrStdout(), action, machines, outcomes)
			})
		},
	}
	power.Flags().StringVar(&reason, "reason", "", "why (recorded in the history with the outcome)")
	return power
}

// powerOutcome is one machine's answer.
type powerOutcome struct {
	resp *bootv1.PowerMachineResponse
	err  error
}

// powerMachines asks gpuboot to do action to each machine, powerParallel at a time.
func powerMachines(ctx context.Context, c bootv1.AdminServiceClient, action bmc.Action, machines []string, reason string) []powerOutcome {
	out := make([]powerOutcome, len(machines))
	sem := make(chan struct{}, powerParallel)
	var wg sync.WaitGroup
	for i, m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := c.PowerMachine(ctx, &bootv1.PowerMachineRequest{Machine: m, Action: admin.PowerActionProto(action), Reason: reason})
			out[i] = powerOutcome{resp: resp, err: err}
		}()
	}
	wg.Wait()
	return out
}

// printPower writes one line per machine, in the order given, and returns an error
// counting the failures.
func printPower(w io.Writer, action bmc.Action, machines []string, outcomes []powerOutcome) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tPOWER\tWHAT")
	failed := 0
	for i, m := range machines {
		o := outcomes[i]
		if o.err != nil {
			failed++
			st := status.Convert(o.err)
			fmt.Fprintf(tw, "%s\t-\t%s: %s\n", m, st.Code(), st.Message())
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m, dash(o.resp.GetPowerState()), powerWhat(action, o.resp))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("power %s failed on %d of %d machines", action, failed, len(machines))
	}
	return nil
}

// powerWhat says in one line what the BMC did for a machine.
func powerWhat(action bmc.Action, r *bootv1.PowerMachineResponse) string {
	where := fmt.Sprintf("BMC %s system %s", r.GetBmc(), r.GetSystem())
	switch {
	case action == bmc.ActionStatus:
		return where
	case len(r.GetResets()) == 0:
		return fmt.Sprintf("already %s: nothing sent (%s)", r.GetPowerState(), where)
	}
	var sent []string
	for _, x := range r.GetResets() {
		s := "waited"
		if x.GetResetType() != "" {
			s = fmt.Sprintf("%s (HTTP %d", x.GetResetType(), x.GetHttpStatus())
			if x.GetTask() != "" {
				s += ", task " + dash(x.GetTaskState())
			}
			s += ")"
		}
		sent = append(sent, s)
	}
	return fmt.Sprintf("was %s; %s; %s after %s (%s)", r.GetPowerStateBefore(), strings.Join(sent, ", "), r.GetPowerState(),
		r.GetElapsed().AsDuration().Round(100*time.Millisecond), where)
}

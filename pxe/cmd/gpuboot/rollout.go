package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

func newRolloutCommand() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Roll machines to another image: canary first, then batches; pause, resume, roll back (AdminService, operator certificate)",
		Long: `A rollout moves machines to an image one step at a time (decision 0687). Each machine
is pinned to the image (a pin wins over every selector: see "gpuboot machines show"),
tainted gpurack.io/rollout and drained through the eviction API (PodDisruptionBudgets
hold), power-cycled through its BMC, and waited for until it boots again, passes its
commissioning checklist and is ready on the image; then the taint goes. The canary
goes first and alone; the others follow in batches. The first failed drain, power
cycle or commissioning, or a timeout, stops the rollout: nothing else starts, and
"gpuboot rollout status" says why. Before any machine is touched the image must be in
gpuboot's image store and its signature must verify.

After a rollout is done its pins keep the machines on the image: point the selectors
in gpuboot.yaml at it at your convenience (the pins win until then).`,
	}
	f.register(cmd)
	cmd.AddCommand(newRolloutStartCommand(&f), newRolloutStatusCommand(&f),
		newRolloutActionCommand(&f, "pause", "Stop starting machines; those under way finish their step", bootv1.AdminServiceClient.PauseRollout),
		newRolloutActionCommand(&f, "resume", "Start machines again after a pause or a stop (a failed machine is tried again)", bootv1.AdminServiceClient.ResumeRollout),
		newRolloutActionCommand(&f, "rollback", "Move every machine the rollout touched back to its previous image, the same way", bootv1.AdminServiceClient.RollbackRollout),
		newRolloutReleaseCommand(&f))
	return cmd
}

func newRolloutReleaseCommand(f *clientFlags) *cobra.Command {
	var req bootv1.ReleaseRolloutRequest
	cmd := &cobra.Command{
		Use:   "release [ROLLOUT] [--force] [--reason R]",
		Short: "Remove the image pins a finished rollout left, so gpuboot.yaml decides again (the newest rollout by default)",
		Long: `Once a rollout is done (or rolled back) its pins keep its machines on its image, whatever
gpuboot.yaml's selectors say. After pointing the selectors (or the rack's defaultImage)
at that image, release the pins: the configuration then decides, and a later change
of it reaches these machines too. A machine whose configuration still chooses another
image keeps its pin, and the line names that image; --force releases it anyway, and
its next boot is that other image. Nothing is rebooted. Check with gpuboot machines
show MACHINE ("next boot:").`,
		Example: `  gpuboot config check --config /etc/gpuboot/gpuboot.yaml   # the selector now names the new image
  gpuboot rollout release --reason "selectors point at 3f9c…e1"`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Id = firstArg(args)
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				resp, err := c.ReleaseRollout(ctx, &req)
				if err != nil {
					return err
				}
				printReleased(cmd.OutOrStdout(), resp)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why; kept in each machine's history")
	cmd.Flags().BoolVar(&req.Force, "force", false, "release pins even where the configuration chooses another image (their next boot changes image)")
	return cmd
}

// printReleased writes one line a machine, then the count.
func printReleased(w io.Writer, resp *bootv1.ReleaseRolloutResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tMACHINE\tPINNED\tNEXT BOOT\tRELEASED\tWHY")
	released := 0
	for _, m := range resp.Machines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\n", m.NodeName, m.MachineId, m.PinnedImageId, m.NextImageId, m.Released, m.Message)
		if m.Released {
			released++
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "rollout %s: %d pins released, %d kept\n", resp.RolloutId, released, len(resp.Machines)-released)
}

func newRolloutStartCommand(f *clientFlags) *cobra.Command {
	var req bootv1.StartRolloutRequest
	var selector []string
	var nodeTimeout, drainTimeout time.Duration
	var canary, batch, maxUnavailable int
	start := &cobra.Command{
		Use:   "start --image ID (--selector KEY=VALUE… | MACHINE…) [--canary N] [--batch-size N] [--max-unavailable N]",
		Short: "Start a rollout; it runs in gpuboot, watch it with rollout status",
		Example: `  gpuboot rollout start --image 3f9c…e1 --selector rack=r1 --batch-size 4 --reason "driver 550"
  gpuboot rollout start --image 3f9c…e1 gpu-r1-03 gpu-r1-04`,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Machines = args
			req.Match = map[string]string{}
			for _, term := range selector {
				k, v, ok := strings.Cut(term, "=")
				if !ok || k == "" {
					return fmt.Errorf("--selector %q: write KEY=VALUE (rack, slot, sku, machine or an inventory label)", term)
				}
				req.Match[k] = v
			}
			req.Canary, req.BatchSize, req.MaxUnavailable = int32(canary), int32(batch), int32(maxUnavailable)
			req.NodeTimeout, req.DrainTimeout = durationpb.New(nodeTimeout), durationpb.New(drainTimeout)
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				r, err := c.StartRollout(ctx, &req)
				if err != nil {
					return err
				}
				printRollout(cmd.OutOrStdout(), r)
				return nil
			})
		},
	}
	start.Flags().StringVar(&req.ImageId, "image", "", "the image id to roll out (required)")
	start.Flags().StringArrayVar(&selector, "selector", nil, "choose the ready machines whose labels match KEY=VALUE (repeat for more terms)")
	start.Flags().IntVar(&canary, "canary", 1, "machines that go first, alone")
	start.Flags().IntVar(&batch, "batch-size", 1, "machines per batch after the canary")
	start.Flags().IntVar(&maxUnavailable, "max-unavailable", 0, "at most this many machines unavailable at once (default: the batch size)")
	start.Flags().DurationVar(&nodeTimeout, "node-timeout", 20*time.Minute, "how long one machine may take from its power cycle to ready")
	start.Flags().DurationVar(&drainTimeout, "drain-timeout", 5*time.Minute, "how long one node's drain may take")
	start.Flags().StringVar(&req.Reason, "reason", "", "why; recorded in each machine's history")
	start.MarkFlagRequired("image")
	return start
}

func newRolloutStatusCommand(f *clientFlags) *cobra.Command {
	var out string
	status := &cobra.Command{
		Use:   "status [ROLLOUT] [-o json]",
		Short: "Show a rollout (the newest by default): its state, why, and each machine's phase",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				r, err := c.GetRollout(ctx, &bootv1.GetRolloutRequest{Id: firstArg(args)})
				if err != nil {
					return err
				}
				if out == "json" {
					return writeJSON(cmd.OutOrStdout(), r)
				}
				printRollout(cmd.OutOrStdout(), r)
				return nil
			})
		},
	}
	status.Flags().StringVarP(&out, "output", "o", "text", "text or json")
	return status
}

func newRolloutActionCommand(f *clientFlags, name, short string,
	do func(bootv1.AdminServiceClient, context.Context, *bootv1.RolloutActionRequest, ...grpc.CallOption) (*bootv1.Rollout, error)) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   name + " [ROLLOUT] [--reason R]",
		Short: short + " (the newest rollout by default)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				r, err := do(c, ctx, &bootv1.RolloutActionRequest{Id: firstArg(args), Reason: reason})
				if err != nil {
					return err
				}
				printRollout(cmd.OutOrStdout(), r)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why; kept with the rollout")
	return cmd
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// printRollout writes a rollout as rollout status shows it.
func printRollout(w io.Writer, r *bootv1.Rollout) {
	fmt.Fprintf(w, "rollout %s: %s, image %s\n", r.Id, r.State, r.ImageId)
	if r.Reason != "" {
		fmt.Fprintf(w, "  %s\n", r.Reason)
	}
	fmt.Fprintf(w, "  started %s by %s; canary %d, batch size %d, max unavailable %d, node timeout %s, drain timeout %s\n",
		ts(r.StartedAt), r.Actor, r.Canary, r.BatchSize, r.MaxUnavailable, r.NodeTimeout.AsDuration(), r.DrainTimeout.AsDuration())
	if r.EndedAt != nil {
		fmt.Fprintf(w, "  ended %s\n", ts(r.EndedAt))
	}
	counts := map[string]int{}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tNODE\tMACHINE\tPHASE\tUNAVAILABLE\tMESSAGE")
	for _, m := range r.Machines {
		counts[m.Phase]++
		unavailable := "-"
		switch {
		case m.StartedAt != nil && m.ReadyAt != nil:
			unavailable = m.ReadyAt.AsTime().Sub(m.StartedAt.AsTime()).Round(time.Second).String()
		case m.StartedAt != nil:
			unavailable = "since " + ts(m.StartedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", m.Batch, dash(m.NodeName), m.MachineId, m.Phase, unavailable, m.Message)
	}
	tw.Flush()
	var parts []string
	for _, p := range []string{"done", "pending", "draining", "cycling", "booting", "failed", "skipped"} {
		if counts[p] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[p], p))
		}
	}
	fmt.Fprintf(w, "machines: %s\n", strings.Join(parts, ", "))
}

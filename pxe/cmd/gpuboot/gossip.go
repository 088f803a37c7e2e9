package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

func newGossipCommand() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "gossip", Short: "Rack gossip keys: rotate one, see where a rotation stands (AdminService, operator certificate)"}
	f.register(cmd)
	var wait time.Duration
	var asJSON bool
	rotate := &cobra.Command{
		Use:   "rotate RACK [--wait DURATION]",
		Short: "Replace a rack's gossip key without any node dropping out of the rack",
		Long: `Replace a rack's gossip (memberlist) key while the rack runs. gpuboot adds a new key
that agents accept beside the current one (installing); once every live agent of the
rack reports that key ring in its heartbeat, agents encrypt with the new key and only
accept the old one (retiring); once every live agent reports that, the old key is
dropped (steady). Agents take each step from gpuboot's answer to their heartbeat (every
10 s), so a rack moves through the rotation in about a minute.

An agent that is offline during the rotation takes the current ring from its next
heartbeat. A live agent that never reports the ring (an agent older than this feature)
holds the rotation; "gpuboot gossip status RACK" names it.

--wait waits up to DURATION for the rotation to reach steady, printing each step.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				st, err := c.RotateGossipKey(ctx, &bootv1.RotateGossipKeyRequest{Rack: args[0]})
				if err != nil {
					return err
				}
				printGossipStatus(cmd.OutOrStdout(), st)
				if wait <= 0 {
					return nil
				}
				return waitGossipSteady(cmd.OutOrStdout(), c, args[0], st, wait)
			})
		},
	}
	rotate.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the rotation to finish (0: return at once)")
	status := &cobra.Command{
		Use:   "status RACK [--json]",
		Short: "Show a rack's gossip key ring by fingerprint and the agents a rotation waits for",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				st, err := c.GetGossipKeyStatus(ctx, &bootv1.GetGossipKeyStatusRequest{Rack: args[0]})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), st)
				}
				printGossipStatus(cmd.OutOrStdout(), st)
				return nil
			})
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(rotate, status)
	return cmd
}

// waitGossipSteady polls the rotation until it is steady or wait runs out. The call's
// own timeout (--timeout) does not bound it: each poll gets a fresh 10 s.
func waitGossipSteady(w io.Writer, c bootv1.AdminServiceClient, rack string, st *bootv1.GossipKeyStatus, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	last := st.GetPhase()
	for st.GetPhase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		if time.Now().After(deadline) {
			return fmt.Errorf("rotation of rack %s still %s after %s; waiting for %s (see gpuboot gossip status %s)",
				rack, protoconv.PhaseWord(st.GetPhase()), wait, strings.Join(st.GetBehind(), ", "), rack)
		}
		time.Sleep(2 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		next, err := c.GetGossipKeyStatus(ctx, &bootv1.GetGossipKeyStatusRequest{Rack: rack})
		cancel()
		if err != nil {
			return err
		}
		st = next
		if st.GetPhase() != last {
			printGossipStatus(w, st)
			last = st.GetPhase()
		}
	}
	return nil
}

func printGossipStatus(w io.Writer, st *bootv1.GossipKeyStatus) {
	fmt.Fprintf(w, "rack %s: %s, encrypting with key %s", st.GetRack(), protoconv.PhaseWord(st.GetPhase()), st.GetPrimaryFingerprint())
	if acc := st.GetAcceptedFingerprints(); len(acc) > 0 {
		fmt.Fprintf(w, ", also accepting %s", strings.Join(acc, ", "))
	}
	if s := st.GetPhaseSince(); s != nil {
		fmt.Fprintf(w, " (since %s)", ts(s))
	}
	fmt.Fprintln(w)
	if b := st.GetBehind(); len(b) > 0 {
		fmt.Fprintf(w, "  waiting for %d agent(s) to report the ring: %s\n", len(b), strings.Join(b, ", "))
	}
}

func newOperatorsCommand() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "operators", Short: "Operator credentials: revoke an operator's certificates and tokens, read the revocation audit (AdminService, an admin's certificate)"}
	f.register(cmd)
	revoke := newOperatorRevokeCommand(&f, "revoke NAME [--serial HEX]... [--reason TEXT]")
	var limit int32
	var asJSON bool
	audit := &cobra.Command{
		Use:   "audit [--limit N] [--json]",
		Short: "List the operator revocations gpuboot recorded: when, who, whom, serials, tokens, reason",
		Long: `List gpuboot's audit record of operator revocations (STATEDIR/operators/audit,
append-only), oldest first: when, who revoked (and at which level), whose credentials,
the certificate serials put on the revocation list, the tokens removed, the reason, and
what failed if a revocation did not complete. It needs an admin's certificate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				resp, err := c.ListOperatorAudit(ctx, &bootv1.ListOperatorAuditRequest{Limit: limit})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), resp)
				}
				printOperatorAudit(cmd.OutOrStdout(), resp.GetEntries())
				return nil
			})
		},
	}
	audit.Flags().Int32Var(&limit, "limit", 0, "only the last N entries (0: all)")
	audit.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(revoke, audit)
	return cmd
}

// newOperatorRevokeCommand is `gpuboot operators revoke NAME`, also reached as `gpuboot
// certs revoke operator NAME` (use is the command's usage line there).
func newOperatorRevokeCommand(f *clientFlags, use string) *cobra.Command {
	var reason string
	var serials []string
	revoke := &cobra.Command{
		Use:   use,
		Short: "Revoke every certificate and bearer token of an operator",
		Long: `Revoke an operator's access: every operator certificate gpuboot recorded issuing to
NAME (STATEDIR/operators/issued) goes on gpuboot's revocation list, which AdminService,
the REST API and the rack view check on every call, and NAME's bearer tokens are removed
from the token file, which gpuboot re-reads within a second. Certificates issued before
gpuboot recorded them can be named with --serial (the serial number in hex, as
"openssl x509 -noout -serial" prints it). It needs an admin's certificate (level
admin; gpuboot init's first operator is one), another than NAME's: an operator cannot
revoke itself. Every revocation is appended to gpuboot's audit record (gpuboot
operators audit). "gpuboot operators revoke" and "gpuboot certs revoke operator" are
the same command.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				resp, err := c.RevokeOperator(ctx, &bootv1.RevokeOperatorRequest{Name: args[0], Reason: reason, Serials: serials})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "operator %s: %d certificate(s) revoked %v, %d token(s) removed\n", args[0], len(resp.GetSerials()), resp.GetSerials(), resp.GetTokensRemoved())
				return nil
			})
		},
	}
	revoke.Flags().StringVar(&reason, "reason", "", "why, for gpuboot's log and audit record")
	revoke.Flags().StringSliceVar(&serials, "serial", nil, "also revoke this certificate serial (hex)")
	return revoke
}

func printOperatorAudit(w io.Writer, entries []*bootv1.OperatorAuditEntry) {
	if len(entries) == 0 {
		fmt.Fprintln(w, "no operator revocations recorded")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tBY\tLEVEL\tREVOKED\tSERIALS\tTOKENS\tREASON\tERROR")
	for _, e := range entries {
		serials := strings.Join(e.GetSerials(), ",")
		if serials == "" {
			serials = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%q\t%s\n", ts(e.GetTime()), e.GetActor(), e.GetActorLevel(), e.GetOperator(),
			serials, e.GetTokensRemoved(), e.GetReason(), dash(e.GetError()))
	}
	tw.Flush()
}

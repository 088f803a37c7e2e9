package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/auditlog"
)

func newAuditCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read the apiserver's audit log",
		Long: `The apiserver writes every request to DIR/logs/audit.log (the policy: docs/controlplane.md),
rotating it beside itself. audit reads it; it works whether the control plane runs or not.`,
	}
	cmd.AddCommand(newAuditBreakGlassCommand())
	return cmd
}

func newAuditBreakGlassCommand() *cobra.Command {
	var dir string
	var since time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "break-glass --dir DIR [--since DURATION] [--json]",
		Short: "Who got onto a node or into a container, and when",
		Long: `break-glass lists, oldest first, the requests in the audit log that open a shell or a
stream on a node or in a pod:

  debug-node-pod       a kubectl debug node/NAME pod created (node-debugger-NODE-xxxxx)
  exec, attach         kubectl exec, kubectl attach (and kubectl debug's own attach)
  port-forward         kubectl port-forward
  ephemeral-container  kubectl debug POD (an ephemeral container added)
  node-proxy           the kubelet API through the apiserver (nodes/NAME/proxy)

with the user (USER as OTHER when impersonated), the target, the command of an exec,
the response code (101: a stream opened; 403: refused) and the first source address.
What was typed inside a shell is not in the apiserver's log: the debug image records
each command line in the node's journal (journalctl -t gpurack-break-glass on the
node; docs/operations.md, "Getting onto a node").

Lines that are not audit events (a truncated last line) are counted on stderr, never
fatal.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since < 0 {
				return fmt.Errorf("--since %s: want a positive duration, for example 24h", since)
			}
			var from time.Time
			if since > 0 {
				from = time.Now().Add(-since)
			}
			accesses, st, err := auditlog.Read(dir, from)
			if err != nil {
				return err
			}
			if st.Skipped > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d lines of %s are not audit events; skipped\n", st.Skipped, strings.Join(st.Files, ", "))
			}
			if asJSON {
				if accesses == nil {
					accesses = []auditlog.Access{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(accesses)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TIME\tUSER\tACTION\tTARGET\tCODE\tFROM\tCOMMAND")
			for _, a := range accesses {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.Time.UTC().Format(time.RFC3339), a.User, a.Action, a.Target, a.Code, a.SourceIP, a.Command)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if len(accesses) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "no break-glass requests in %d audit events\n", st.Events)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "/var/lib/gpurack/cluster", "the cluster directory init made")
	cmd.Flags().DurationVar(&since, "since", 0, "only requests received this long ago or later (0: all the log holds)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array for scripts")
	return cmd
}

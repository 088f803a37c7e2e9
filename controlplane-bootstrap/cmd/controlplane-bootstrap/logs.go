package main

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/logquery"
	"github.com/gpurack/gpurack/controlplane-bootstrap/logsgateway"
)

func newLogsGatewayCommand() *cobra.Command {
	return &cobra.Command{
		Use:   logsgateway.Command + " --listen HOST:PORT --upstream URL --cert-file F --key-file F --client-ca-file F",
		Short: "Run the log store's ingestion gateway (init runs it as a component; not for use by hand)",
		// Its flags are the gateway's own (logsgateway.Main), so that a test binary can
		// run it without this command tree.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return logsgateway.Main(cmd.Context(), args, cmd.ErrOrStderr())
		},
	}
}

// logsFlags are the logs command's flags.
type logsFlags struct {
	dir         string
	f           logquery.Filter
	since       string
	from, until string
	limit       int
	output      string
	boots       bool
}

func newLogsCommand() *cobra.Command {
	var lf logsFlags
	cmd := &cobra.Command{
		Use:   "logs --dir DIR [--node N] [--unit U] [--identifier ID] [--namespace NS] [--pod P] [--container C] [--boot ID] [--since DUR | --from T] [--until T] [--limit N] [--query LOGSQL] [--output text|json] [--boots]",
		Short: "Print the nodes' journal and container lines from the log store",
		Long: `logs asks the log store on this control-plane host (VictoriaLogs, monitoring.logs in
cluster.yaml; docs/monitoring.md "Logs") for the lines the nodes shipped, and prints them
oldest first: time (UTC), node, unit or namespace/pod/container, message.

Every flag narrows the selection (they are ANDed); values must be what the field holds
(a node name, a unit name such as kubelet.service, a DNS label for a namespace or a
container, 32 hex digits for a boot). --query adds LogsQL of your own, for example
'error OR "out of memory"' or '_msg:~"XID [0-9]+"'.

The newest --limit lines of the range are printed (default 1000; 0 prints all). The
range is --since before now (default 1h), or --from to --until (RFC 3339 times;
--until defaults to now).

--boots lists the boots of the selected node(s) instead: each boot_id with the time of
its first and last line. Give one to --boot to read that boot, such as the one before
a node rebooted.

Examples:
  controlplane-bootstrap logs --dir DIR --node gpu-r1-u01 --unit kubelet.service --since 30m
  controlplane-bootstrap logs --dir DIR --node gpu-r1-u01 --identifier gpurack-break-glass --since 1d
  controlplane-bootstrap logs --dir DIR --namespace vision --pod train-0 --container main
  controlplane-bootstrap logs --dir DIR --node gpu-r1-u01 --boots --since 7d
  controlplane-bootstrap logs --dir DIR --node gpu-r1-u01 --boot 3f0c5a3e9d8b4c7aa1b2c3d4e5f60718 --since 7d
  controlplane-bootstrap logs --dir DIR --node gpu-r1-u01 --query 'xid' --output json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runLogs(cmd, &lf) },
	}
	dirFlag(cmd, &lf.dir)
	fl := cmd.Flags()
	fl.StringVar(&lf.f.Node, "node", "", "node name")
	fl.StringVar(&lf.f.Unit, "unit", "", "systemd unit of journal lines (kubelet.service); a line without one has its syslog identifier here")
	fl.StringVar(&lf.f.Identifier, "identifier", "", "syslog identifier of journal lines, as journalctl -t (gpurack-break-glass)")
	fl.StringVar(&lf.f.Namespace, "namespace", "", "namespace of container lines")
	fl.StringVar(&lf.f.Pod, "pod", "", "pod of container lines")
	fl.StringVar(&lf.f.Container, "container", "", "container of container lines")
	fl.StringVar(&lf.f.Boot, "boot", "", "boot ID (32 hex digits; --boots lists them)")
	fl.StringVar(&lf.f.Source, "source", "", "journal or container")
	fl.StringVar(&lf.f.Extra, "query", "", "more LogsQL, ANDed to the flags' filters")
	fl.StringVar(&lf.since, "since", "", "lines from this long ago until now: a Go duration or days, 30m, 12h, 7d (default 1h)")
	fl.StringVar(&lf.from, "from", "", "lines from this time on (RFC 3339, 2026-12-04T08:00:00Z)")
	fl.StringVar(&lf.until, "until", "", "lines before this time (RFC 3339; default now)")
	fl.IntVar(&lf.limit, "limit", 1000, "print the newest N lines of the range; 0: all")
	fl.StringVar(&lf.output, "output", "text", "text, or json (one object per line with every field)")
	fl.BoolVar(&lf.boots, "boots", false, "list the boots (boot_id, first and last line) instead of lines")
	return cmd
}

// timeRange is the range the flags select: --from/--until, or --since (default 1h)
// before now.
func (lf *logsFlags) timeRange(now time.Time) (time.Time, time.Time, error) {
	if lf.from != "" && lf.since != "" {
		return time.Time{}, time.Time{}, errors.New("give --since or --from, not both")
	}
	end := now
	if lf.until != "" {
		t, err := time.Parse(time.RFC3339Nano, lf.until)
		if err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("--until %q is not an RFC 3339 time (2026-12-04T09:00:00Z)", lf.until)
		}
		end = t
	}
	if lf.from != "" {
		start, err := time.Parse(time.RFC3339Nano, lf.from)
		if err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("--from %q is not an RFC 3339 time (2026-12-04T08:00:00Z)", lf.from)
		}
		if !start.Before(end) {
			return time.Time{}, time.Time{}, fmt.Errorf("--from %s is not before --until %s", lf.from, end.Format(time.RFC3339))
		}
		return start, end, nil
	}
	since := time.Hour
	if lf.since != "" {
		d, err := parseSince(lf.since)
		if err != nil {
			return time.Time{}, time.Time{}, err
		}
		since = d
	}
	return end.Add(-since), end, nil
}

// parseSince reads --since: a positive Go duration, or a number of days (7d).
func parseSince(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 && n <= 36500 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	} else if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d, nil
	}
	return 0, fmt.Errorf("--since %q is not a positive duration: 30m, 12h or 7d", s)
}

func runLogs(cmd *cobra.Command, lf *logsFlags) error {
	if err := lf.f.Validate(); err != nil {
		return err
	}
	if lf.output != "text" && lf.output != "json" {
		return fmt.Errorf("--output %q: write text or json", lf.output)
	}
	if lf.limit < 0 {
		return fmt.Errorf("--limit %d is negative", lf.limit)
	}
	start, end, err := lf.timeRange(time.Now())
	if err != nil {
		return err
	}
	cp, err := controlplane.Open(lf.dir)
	if err != nil {
		return err
	}
	if !cp.Config.Monitoring.LogsEnabled() {
		return fmt.Errorf("the log store is not enabled in %s: set monitoring.enabled (and not monitoring.logs.enabled: false) and run init", cp.Layout.ConfigFile())
	}
	req := logquery.Request{Query: lf.f.LogsQL(), Start: start, End: end, Limit: lf.limit}
	if lf.boots {
		req.Query, req.Limit = logquery.BootsQuery(lf.f), 0
	}
	client := &http.Client{Timeout: 5 * time.Minute}
	es, err := logquery.Query(cmd.Context(), client, components.VictoriaLogsURL(cp.Config), req)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	switch {
	case lf.output == "json":
		if !lf.boots {
			logquery.SortByTime(es)
		}
		return logquery.FormatJSON(out, es)
	case lf.boots:
		return logquery.FormatBoots(out, es)
	}
	logquery.SortByTime(es)
	if err := logquery.FormatText(out, es); err != nil {
		return err
	}
	if lf.limit > 0 && len(es) == lf.limit {
		fmt.Fprintf(cmd.ErrOrStderr(), "(the newest %s lines; --limit 0 or a narrower range prints the rest)\n", strconv.Itoa(lf.limit))
	}
	if len(es) == 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "no lines match %s between %s and %s\n", strings.TrimSpace(req.Query), start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))
	}
	return nil
}

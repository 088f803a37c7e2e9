package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pbjson"
	"github.com/gpurack/gpurack/pxe/adminclient"
	"github.com/gpurack/gpurack/pxe/checklist"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/protoconv"
	"github.com/gpurack/gpurack/pxe/report"
)

// clientFlags are the operator connection flags of machines and rack.
type clientFlags struct {
	server, credentials string
	timeout             time.Duration
}

func (f *clientFlags) register(cmd *cobra.Command) {
	defServer := os.Getenv("GPUBOOT_SERVER")
	if defServer == "" {
		defServer = "localhost:8443"
	}
	defCreds := os.Getenv("GPUBOOT_CREDENTIALS")
	if defCreds == "" {
		defCreds = filepath.Join(defaultStateDir, "operators", "admin")
	}
	cmd.PersistentFlags().StringVar(&f.server, "server", defServer, "gpuboot's TLS address HOST:PORT ($GPUBOOT_SERVER)")
	cmd.PersistentFlags().StringVar(&f.credentials, "credentials", defCreds, "operator credentials directory: ca.crt, operator.crt, operator.key ($GPUBOOT_CREDENTIALS)")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for gpuboot")
}

func (f *clientFlags) call(fn func(ctx context.Context, c bootv1.AdminServiceClient) error) error {
	c, closeFn, err := adminclient.DialAdmin(f.server, f.credentials)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	return fn(ctx, c)
}

func newMachinesCommand() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "machines",
		Short: "List, inspect and decide on machines (AdminService, operator certificate)",
		Long:  `Machines are named by a MACHINE reference: the inventory id, the node name or the boot MAC.`,
	}
	f.register(cmd)
	reject, resolve, decom := newMachinesDecisionCommands(&f)
	cmd.AddCommand(newMachinesListCommand(&f), newMachinesShowCommand(&f), newMachinesApproveCommand(&f), reject, resolve, decom,
		newMachinesWipeDiskCommand(&f), newMachinesPowerCommand(&f), newMachinesHistoryCommand(&f))
	return cmd
}

// newMachinesListCommand is `machines list`.
func newMachinesListCommand(f *clientFlags) *cobra.Command {
	var states []string
	var rack, output string
	list := &cobra.Command{
		Use:   "list [--state S]… [--rack R]",
		Short: "List machines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &bootv1.ListMachinesRequest{Rack: rack}
			for _, s := range states {
				st, err := inventory.ParseState(s)
				if err != nil {
					return err
				}
				req.States = append(req.States, protoconv.StateProto(st))
			}
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				var all []*bootv1.Machine
				for {
					resp, err := c.ListMachines(ctx, req)
					if err != nil {
						return err
					}
					all = append(all, resp.Machines...)
					if resp.NextPageToken == "" {
						break
					}
					req.PageToken = resp.NextPageToken
				}
				if output == "json" {
					return writeJSON(cmd.OutOrStdout(), &bootv1.ListMachinesResponse{Machines: all})
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSTATE\tRACK\tSLOT\tNODE\tMAC\tSERIAL\tCHECKS\tKEY")
				for _, m := range all {
					checks := "-"
					if m.Checklist != nil {
						checks = report.StatusName(checklist.Overall(m.Checklist))
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Id, report.StateName(m.State), dash(m.Rack), dash(m.Slot),
						dash(m.NodeName), m.GetIdentity().GetBootMac(), dash(m.GetIdentity().GetSerial()), checks, dash(shortFP(m.KeyFingerprint)))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringSliceVar(&states, "state", nil, "only machines in these states")
	list.Flags().StringVar(&rack, "rack", "", "only machines of this rack")
	list.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return list
}

// newMachinesShowCommand is `machines show`.
func newMachinesShowCommand(f *clientFlags) *cobra.Command {
	var showOut string
	show := &cobra.Command{
		Use:   "show MACHINE",
		Short: "Show a machine: identity, facts, data disks, checklist, key fingerprint and history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				m, err := c.GetMachine(ctx, &bootv1.GetMachineRequest{Machine: args[0]})
				if err != nil {
					return err
				}
				if showOut == "json" {
					return writeJSON(cmd.OutOrStdout(), m)
				}
				printMachine(cmd.OutOrStdout(), m)
				return nil
			})
		},
	}
	show.Flags().StringVarP(&showOut, "output", "o", "text", "text or json")
	return show
}

// newMachinesApproveCommand is `machines approve`.
func newMachinesApproveCommand(f *clientFlags) *cobra.Command {
	var reason, nodeName, apRack, slot string
	approve := &cobra.Command{
		Use:   "approve MACHINE [--reason R] [--node-name N] [--rack R] [--slot S]",
		Short: "Approve a machine: it gets its JoinBundle once, for the key shown by `machines show` (again for a joining machine whose agent lost it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				m, err := c.Approve(ctx, &bootv1.ApproveRequest{Machine: args[0], Reason: reason, NodeName: nodeName, Rack: apRack, Slot: slot})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s (key %s)\n", m.Id, report.StateName(m.State), dash(m.KeyFingerprint))
				return nil
			})
		},
	}
	approve.Flags().StringVar(&reason, "reason", "", "why (recorded in the history)")
	approve.Flags().StringVar(&nodeName, "node-name", "", "Kubernetes node name (default: gpuboot's naming rule)")
	approve.Flags().StringVar(&apRack, "rack", "", "place the machine in this rack")
	approve.Flags().StringVar(&slot, "slot", "", "place the machine in this slot")
	return approve
}

// newMachinesDecisionCommands are `machines reject`, `resolve-conflict` and
// `decommission`: each needs a reason.
func newMachinesDecisionCommands(f *clientFlags) (reject, resolve, decom *cobra.Command) {
	var reason, key string
	simple := func(use, short string, call func(ctx context.Context, c bootv1.AdminServiceClient, ref string) (*bootv1.Machine, error)) *cobra.Command {
		cmd := &cobra.Command{
			Use: use, Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if reason == "" {
					return fmt.Errorf("--reason is required: it is recorded in the machine's history")
				}
				return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
					m, err := call(ctx, c, args[0])
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", m.Id, report.StateName(m.State))
					return nil
				})
			},
		}
		cmd.Flags().StringVar(&reason, "reason", "", "why (required, recorded in the history)")
		return cmd
	}
	reject = simple("reject MACHINE --reason R", "Reject a discovered or registered machine", func(ctx context.Context, c bootv1.AdminServiceClient, ref string) (*bootv1.Machine, error) {
		return c.Reject(ctx, &bootv1.RejectRequest{Machine: ref, Reason: reason})
	})
	decom = simple("decommission MACHINE --reason R", "Retire a machine: revoke its certificate, delete its Node and tokens", func(ctx context.Context, c bootv1.AdminServiceClient, ref string) (*bootv1.Machine, error) {
		return c.Decommission(ctx, &bootv1.DecommissionRequest{Machine: ref, Reason: reason})
	})
	resolve = simple("resolve-conflict MACHINE --key FINGERPRINT --reason R", "End a conflict by choosing the key that keeps the identity", func(ctx context.Context, c bootv1.AdminServiceClient, ref string) (*bootv1.Machine, error) {
		if key == "" {
			return nil, fmt.Errorf("--key is required: the fingerprint (sha256:…) of the winning key, from `machines show`")
		}
		return c.ResolveConflict(ctx, &bootv1.ResolveConflictRequest{Machine: ref, WinningKeyFingerprint: key, Reason: reason})
	})
	resolve.Flags().StringVar(&key, "key", "", "fingerprint of the key that wins (required)")
	return reject, resolve, decom
}

// newMachinesWipeDiskCommand is `machines wipe-disk`.
func newMachinesWipeDiskCommand(f *clientFlags) *cobra.Command {
	var disk, serial, reason string
	wipe := &cobra.Command{
		Use:   "wipe-disk MACHINE --disk PATH --serial SERIAL --reason R",
		Short: "Ask a machine's agent to wipe a data disk it refused, so that it can prepare it",
		Long: `Ask the machine's agent to wipe a data disk it refused (it holds something gpurack did
not make) or failed to prepare, so that the agent can prepare it as this cluster's data
disk (docs/storage.md). Name the disk by its device path and, as confirmation, its
serial, both as ` + "`gpuboot machines show MACHINE`" + ` lists them under "data disks". gpuboot
refuses a serial that is not the one the agent reported for that path, a disk that is
ready (this cluster's volumes are on it), a machine that is not approved, joining or
ready, and a machine with a wipe pending.

gpuboot records the request in the machine's history and hands it to the agent in its
next heartbeat answer over the agent's certificate (so a machine still approved gets it
once it joined). The agent checks the serial again on the disk itself, and refuses when
it differs, when the disk has no serial, or when the disk is mounted or held by RAID or
LVM. A wipe zeroes the first and last 2 MiB of the disk (partition tables, labels,
superblocks), not the data between: it is not a secure erase, but what the disk held is
no longer readable as it was. The outcome, "wipe-data-disk done" or "wipe-data-disk
refused" with the agent's reason, shows in ` + "`gpuboot machines history MACHINE`" + `.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case disk == "":
				return fmt.Errorf("--disk is required: the disk's device path, as `gpuboot machines show %s` lists it", args[0])
			case serial == "":
				return fmt.Errorf("--serial is required: the disk's serial, as `gpuboot machines show %s` lists it, confirms which disk you mean", args[0])
			case reason == "":
				return fmt.Errorf("--reason is required: it is recorded in the machine's history")
			}
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				m, err := c.WipeDataDisk(ctx, &bootv1.WipeDataDiskRequest{Machine: args[0], Path: disk, Serial: serial, Reason: reason})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: wipe of %s (serial %s) requested as %s; the agent takes it with its next heartbeat: `gpuboot machines history %s` shows the outcome\n",
					m.Id, disk, serial, m.GetPendingWipe().GetId(), m.Id)
				return nil
			})
		},
	}
	wipe.Flags().StringVar(&disk, "disk", "", "the disk's device path, e.g. /dev/nvme1n1 (required)")
	wipe.Flags().StringVar(&serial, "serial", "", "the disk's serial, exactly as machines show lists it (required)")
	wipe.Flags().StringVar(&reason, "reason", "", "why (required, recorded in the history)")
	return wipe
}

// newMachinesHistoryCommand is `machines history`.
func newMachinesHistoryCommand(f *clientFlags) *cobra.Command {
	var hRack string
	var limit uint32
	history := &cobra.Command{
		Use:   "history [MACHINE] [--rack R] [--limit N]",
		Short: "Show lifecycle transitions, oldest first",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &bootv1.HistoryRequest{Rack: hRack, Limit: limit}
			if len(args) == 1 {
				req.Machine = args[0]
			}
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				resp, err := c.History(ctx, req)
				if err != nil {
					return err
				}
				printHistory(cmd.OutOrStdout(), resp.Transitions)
				return nil
			})
		},
	}
	history.Flags().StringVar(&hRack, "rack", "", "only machines of this rack")
	history.Flags().Uint32Var(&limit, "limit", 0, "only the latest N transitions")
	return history
}

func newRackCommand() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{Use: "rack", Short: "Rack commissioning reports (AdminService, operator certificate)"}
	f.register(cmd)
	var format, out string
	rep := &cobra.Command{
		Long: `Render a rack's commissioning checklist: per machine its state, the reason when it
is not plainly ready, and every check; totals of nodes ready, nodes quarantined and GPUs
allocatable; the active alerts Alertmanager reported for the rack's machines and the
cluster (docs/monitoring.md, "Alert routing"). --format html is one self-contained page (inline CSS and an SVG rack
diagram coloured by state, no scripts, nothing fetched) to open in a browser.`,
		Use:   "report RACK [--format md|json|html] [-o FILE]",
		Short: "Render a rack's commissioning report",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fm, err := report.ParseFormat(format)
			if err != nil {
				return err
			}
			return f.call(func(ctx context.Context, c bootv1.AdminServiceClient) error {
				resp, err := c.RackReport(ctx, &bootv1.RackReportRequest{Rack: args[0], Format: fm})
				if err != nil {
					return err
				}
				if out != "" {
					return atomicfile.Write(out, resp.Content, 0o644)
				}
				_, err = cmd.OutOrStdout().Write(resp.Content)
				return err
			})
		},
	}
	rep.Flags().StringVar(&format, "format", "md", "md, json or html")
	rep.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of standard output")
	cmd.AddCommand(rep)
	return cmd
}

func writeJSON(w io.Writer, m proto.Message) error {
	b, err := pbjson.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shortFP(fp string) string {
	if len(fp) > 23 {
		return fp[:23] + "…"
	}
	return fp
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func printMachine(w io.Writer, m *bootv1.Machine) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, dash(v)) }
	row("id:", m.Id)
	row("state:", report.StateName(m.State))
	row("boot MAC:", m.GetIdentity().GetBootMac())
	row("SMBIOS UUID:", m.GetIdentity().GetSmbiosUuid())
	row("serial:", m.GetIdentity().GetSerial())
	row("rack / slot:", m.Rack+" / "+m.Slot)
	row("node name:", m.NodeName)
	row("image:", m.ImageId)
	if n := m.NextImage; n != nil {
		row("next boot:", fmt.Sprintf("image %s, from %s %s: %s", dash(n.ImageId), n.Source, n.Name, n.Reason))
		for _, l := range n.Lost {
			row("", l)
		}
	}
	row("profile:", m.Profile)
	row("key fingerprint:", m.KeyFingerprint)
	if m.EkHash != "" {
		row("TPM EK:", m.EkHash)
	}
	if m.Bmc != "" {
		row("BMC:", m.Bmc)
	}
	if f := m.Facts; f != nil {
		row("hostname:", f.Hostname)
		row("IPs:", strings.Join(f.Ips, ", "))
		row("CPU:", fmt.Sprintf("%s × %d", f.CpuModel, f.CpuCount))
		row("memory:", fmt.Sprintf("%d GiB", f.MemoryBytes>>30))
		row("kernel / driver:", f.KernelVersion+" / "+f.DriverVersion)
		row("booted image:", f.ImageId)
		for _, g := range f.Gpus {
			row(fmt.Sprintf("GPU %d:", g.Index), fmt.Sprintf("%s %s PCIe Gen%d x%d NVLink %d/%d", g.ProductName, g.PciBusId, g.PcieCurrentGen, g.PcieCurrentWidth, g.NvlinkLinksActive, g.NvlinkLinksTotal))
		}
	}
	for _, k := range m.Keys {
		bound := ""
		if k.Bound {
			bound = " (bound)"
		}
		if k.EkHash != "" {
			bound += " TPM EK " + k.EkHash
		}
		row("key:", fmt.Sprintf("%s%s registered %s, last seen %s from %s", k.Fingerprint, bound, ts(k.RegisteredAt), ts(k.LastSeenAt), dash(k.RemoteAddress)))
	}
	row("last heartbeat:", ts(m.LastHeartbeatAt))
	tw.Flush()
	printDataDisks(w, m)
	if cl := m.Checklist; cl != nil {
		phase := strings.ToLower(strings.TrimPrefix(cl.Phase.String(), "CHECK_PHASE_"))
		fmt.Fprintf(w, "\nchecklist (%s, overall %s):\n", phase, report.StatusName(checklist.Overall(cl)))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		res := append([]*machineResult(nil), toResults(cl)...)
		sort.SliceStable(res, func(i, j int) bool { return res[i].rank > res[j].rank })
		for _, r := range res {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r.status, r.id, r.observed, r.remedy)
		}
		tw.Flush()
	}
	if len(m.History) > 0 {
		fmt.Fprintln(w, "\nhistory:")
		printHistory(w, m.History)
	}
}

// printDataDisks prints the machine's data disks as its agent last reported them, one
// row per disk, and the wipe waiting for the agent, if any.
func printDataDisks(w io.Writer, m *bootv1.Machine) {
	if d := m.GetDataDisks(); d != nil {
		looked := ""
		if d.GetCheckedAt() != nil {
			looked = " (the agent looked " + ts(d.GetCheckedAt()) + ")"
		}
		fmt.Fprintf(w, "\ndata disks%s:\n", looked)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PATH\tSTATE\tSERIAL\tMODEL\tSIZE\tDETAIL")
		for _, x := range d.GetDisks() {
			detail := x.GetDetail()
			if x.GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY {
				detail = "mounted at " + x.GetMountPoint()
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", x.GetPath(), report.DiskStateName(x.GetState()), dash(x.GetSerial()),
				dash(x.GetModel()), size(x.GetSizeBytes()), dash(detail))
		}
		tw.Flush()
	}
	if p := m.GetPendingWipe(); p != nil {
		fmt.Fprintf(w, "\npending wipe: %s serial %s (%s), for the agent's next heartbeat; `gpuboot machines history %s` shows who asked\n",
			p.GetPath(), p.GetSerial(), p.GetId(), m.Id)
	}
}

// size is n bytes in binary units, one decimal: "3.5 TiB".
func size(n uint64) string {
	if n == 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v, i = v/1024, i+1
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

type machineResult struct {
	rank                         int
	status, id, observed, remedy string
}

func toResults(cl *machinev1.Checklist) []*machineResult {
	rank := map[machinev1.CheckStatus]int{machinev1.CheckStatus_CHECK_STATUS_FAIL: 4, machinev1.CheckStatus_CHECK_STATUS_WARN: 3, machinev1.CheckStatus_CHECK_STATUS_UNKNOWN: 2}
	var out []*machineResult
	for _, r := range cl.GetResults() {
		id := r.GetId()
		if r.GpuIndex != nil && r.GetGpuIndex() >= 0 {
			id = fmt.Sprintf("%s (GPU %d)", id, r.GetGpuIndex())
		}
		out = append(out, &machineResult{rank: rank[r.GetStatus()], status: report.StatusName(r.GetStatus()), id: id, observed: r.GetObserved(), remedy: r.GetRemedy()})
	}
	return out
}

// printHistory prints transitions, one per line; ACTION is "-" for a lifecycle move and
// names a recorded action (from equals to) otherwise.
func printHistory(w io.Writer, ts []*bootv1.Transition) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tMACHINE\tFROM\tTO\tACTION\tACTOR\tREASON")
	for _, t := range ts {
		from := report.StateName(t.From)
		if from == "unspecified" {
			from = "(new)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Time.AsTime().UTC().Format(time.RFC3339), t.MachineId, from, report.StateName(t.To),
			dash(t.Action), t.Actor, t.Reason)
	}
	tw.Flush()
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

func dirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "dir", "", "cluster directory (PKI, etcd data, kubeconfigs, logs)")
	cmd.MarkFlagRequired("dir")
}

// adminClients opens the control plane in dir and returns admin clients.
func adminClients(dir string) (*controlplane.ControlPlane, kubernetes.Interface, dynamic.Interface, error) {
	cp, err := controlplane.Open(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	rc, err := cp.RESTConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	return cp, cs, dyn, nil
}

func newInitCommand() *cobra.Command {
	var dir, configPath string
	var foreground bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "init --config cluster.yaml --dir DIR [--foreground]",
		Short: "Create the cluster PKI and start etcd, kube-apiserver, kube-controller-manager and kube-scheduler",
		Long: `init creates the cluster PKI and configuration in DIR, starts the control plane,
waits for each component to be healthy, prints their health and applies the join material
(bootstrap-token RBAC, kube-public/cluster-info, kubeadm-config, kubelet-config, the enroller's
RBAC and admission policy).

Without --foreground the components run as systemd units (the host's PID 1 must be systemd).
With --foreground they run as children of this process, which restarts a crashed one with
backoff and stops them all on SIGINT or SIGTERM.

Running init again on the same DIR keeps the PKI and etcd data; if the control plane is
already running there, it only re-applies the join material.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := controlPlaneOptions(cmd, dir, configPath, foreground, timeout)
			if err != nil {
				return err
			}
			return superviseControlPlane(cmd, dir, foreground, func(ctx context.Context, logf func(string, ...any)) (*controlplane.ControlPlane, error) {
				opts.Logf = logf
				return controlplane.Init(ctx, opts)
			})
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "cluster.yaml (see docs/examples/cluster.yaml); optional when DIR already holds one")
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&foreground, "foreground", false, "run the components as supervised child processes of this command")
	cmd.Flags().DurationVar(&timeout, "ready-timeout", 3*time.Minute, "how long to wait for each component to become healthy")
	return cmd
}

// controlPlaneOptions are init's and join's Options from their flags.
func controlPlaneOptions(cmd *cobra.Command, dir, configPath string, foreground bool, timeout time.Duration) (controlplane.Options, error) {
	opts := controlplane.Options{Dir: dir, Out: cmd.OutOrStdout(), ReadyTimeout: timeout, WritePIDFile: foreground}
	if !foreground {
		opts.Mode = controlplane.Systemd
	}
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err != nil {
			return opts, err
		}
		cfg, err := clusterconfig.Parse(configPath, data)
		if err != nil {
			return opts, err
		}
		opts.Config, opts.ConfigYAML = cfg, data
	}
	return opts, nil
}

// superviseControlPlane runs start (init's or join's) with the supervisor's log, prints
// the components' health and, in the foreground, supervises until a signal.
func superviseControlPlane(cmd *cobra.Command, dir string, foreground bool, start func(context.Context, func(string, ...any)) (*controlplane.ControlPlane, error)) error {
	// The supervisor log is opened on the first event, so an init
	// that fails its checks leaves nothing behind in DIR.
	var logFile *os.File
	defer func() {
		if logFile != nil {
			logFile.Close()
		}
	}()
	errOut := cmd.ErrOrStderr()
	logf := func(format string, args ...any) {
		line := time.Now().Format(time.RFC3339) + " " + fmt.Sprintf(format, args...) + "\n"
		fmt.Fprint(errOut, "supervisor: "+line)
		if logFile == nil {
			logFile, _ = openSupervisorLog(dir)
		}
		if logFile != nil {
			logFile.WriteString(line)
		}
	}
	ctx := cmd.Context()
	cp, err := start(ctx, logf)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	printHealth(out, cp)
	if w := cp.Config.AdvertiseWarning(); w != "" {
		fmt.Fprintln(errOut, "warning: "+w)
	}
	if cp.AlreadyRunning || !foreground {
		return nil
	}
	fmt.Fprintf(out, "ready in %s; admin kubeconfig: %s\n", cp.ReadyAfter.Round(time.Millisecond), cp.AdminKubeconfig())
	fmt.Fprintln(out, "supervising in the foreground; SIGINT or SIGTERM (or `controlplane-bootstrap stop`) stops the control plane")
	<-ctx.Done()
	fmt.Fprintln(out, "stopping the control plane")
	cp.Stop()
	return nil
}

func openSupervisorLog(dir string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, "logs", "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

func printHealth(out interface{ Write([]byte) (int, error) }, cp *controlplane.ControlPlane) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPONENT\tHEALTH\tENDPOINT\tDETAIL")
	for _, h := range cp.Health {
		state := "ok"
		if !h.OK {
			state = "NOT READY"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Component, state, h.URL, oneLine(h.Detail))
	}
	tw.Flush()
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func newStatusCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "status --dir DIR",
		Short: "Print each component's process and health, and the floating API address's holder; exit 1 unless all are healthy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := controlplane.GetStatus(cmd.Context(), dir)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "control plane in %s: %s\n", st.Dir, st.Mode)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COMPONENT\tPID\tHEALTH\tENDPOINT\tDETAIL")
			for _, c := range st.Components {
				pid := "-"
				if c.PID > 0 {
					pid = fmt.Sprint(c.PID)
				}
				state := "ok"
				if !c.Health.OK {
					state = "NOT READY"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Name, pid, state, c.Health.URL, oneLine(c.Health.Detail))
			}
			tw.Flush()
			if st.Etcd != nil {
				printEtcd(out, st.Etcd)
			}
			if st.VIP != nil {
				fmt.Fprintln(out, vipLine(st.VIP))
			}
			if !st.Healthy() {
				return errors.New("not every component is healthy")
			}
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

// printEtcd writes status's etcd part: the membership, the leader and each member's
// health, or why they could not be read.
func printEtcd(out io.Writer, es *controlplane.EtcdStatus) {
	if es.Err != "" {
		fmt.Fprintf(out, "etcd: membership unknown: %s\n", oneLine(es.Err))
		return
	}
	leader := es.Leader
	if leader == "" {
		leader = "none (no quorum?)"
	}
	fmt.Fprintf(out, "etcd: %d member(s), leader %s\n", len(es.Members), leader)
	if es.Problem != "" {
		fmt.Fprintf(out, "etcd: WARNING: %s\n", es.Problem)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tID\tHEALTH\tROLE\tDB\tRAFT INDEX\tCLIENT URL\tDETAIL")
	for _, m := range es.Members {
		// "healthy", not the components' "ok": scripts count the components' rows by it.
		health, role := "healthy", "follower"
		if !m.Healthy {
			health = "UNHEALTHY"
		}
		switch {
		case m.Learner:
			role = "learner"
		case m.Leader:
			role = "leader"
		}
		url := "-"
		if len(m.ClientURLs) > 0 {
			url = m.ClientURLs[0]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f MiB\t%d\t%s\t%s\n", m.Name, m.ID, health, role, float64(m.DBSize)/(1<<20), m.RaftIndex, url, oneLine(m.Err))
	}
	tw.Flush()
}

// vipLine is status's line about the floating API address: who holds it, or why that
// is unknown (best effort: it does not make status fail).
func vipLine(v *controlplane.VIPStatus) string {
	switch {
	case v.Err != "":
		return fmt.Sprintf("API address %s (apiServer.vip): holder unknown: %s", v.Address, strings.ReplaceAll(v.Err, "\n", " "))
	case v.Holder == "":
		return fmt.Sprintf("API address %s (apiServer.vip): held by no host (no vip component is campaigning)", v.Address)
	}
	return fmt.Sprintf("API address %s (apiServer.vip): held by %s", v.Address, v.Holder)
}

func newStopCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "stop --dir DIR",
		Short: "Stop the control plane (its supervisor or its systemd units); data stays",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := controlplane.Stop(cmd.Context(), dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "control plane in %s stopped\n", dir)
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

func newResetCommand() *cobra.Command {
	var dir string
	var yes bool
	cmd := &cobra.Command{
		Use:   "reset --dir DIR [--yes]",
		Short: "Stop the control plane and delete DIR: etcd data, PKI, kubeconfigs, logs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := os.Stat(dir); err != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s does not exist; nothing to reset\n", dir)
				return nil
			}
			if !controlplane.LooksLikeClusterDir(dir) {
				return fmt.Errorf("%s does not look like a cluster directory (no cluster.yaml, no pki/ca.crt); refusing to delete it", dir)
			}
			if !yes {
				fmt.Fprintf(cmd.OutOrStdout(), "This stops the control plane and deletes %s: the etcd data (every Kubernetes object), the cluster CA and all credentials.\nType 'yes' to continue: ", dir)
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if strings.TrimSpace(line) != "yes" {
					return errors.New("reset cancelled; nothing was deleted")
				}
			}
			if err := controlplane.Reset(cmd.Context(), dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", dir)
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask before deleting")
	return cmd
}

func newTokenCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke bootstrap tokens"}
	cmd.AddCommand(newTokenCreateCommand(), newTokenListCommand(), newTokenRevokeCommand())
	return cmd
}

func newTokenCreateCommand() *cobra.Command {
	var dir, description string
	var ttl time.Duration
	var groups []string
	cmd := &cobra.Command{
		Use:   "create --dir DIR [--ttl 24h]",
		Short: "Create a bootstrap token and print it (abcdef.0123456789abcdef)",
		Long: `create stores a bootstrap-token Secret (usages authentication and signing,
auth-extra-groups system:bootstrappers:kubeadm:default-node-token), waits until the
controller-manager has signed kube-public/cluster-info with it, and prints the token.
With -v it also prints the kubeadm join command line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, client, _, err := adminClients(dir)
			if err != nil {
				return err
			}
			if ttl == 0 {
				ttl = cp.Config.TokenTTL()
			}
			tok, err := joinconfig.CreateToken(cmd.Context(), client, joinconfig.TokenOptions{TTL: ttl, Description: description, Groups: groups})
			if err != nil {
				return err
			}
			if err := joinconfig.WaitSigned(cmd.Context(), client, tok.String()); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok.String())
			if v, _ := cmd.Flags().GetBool("verbose"); v {
				fmt.Fprintf(cmd.ErrOrStderr(), "kubeadm join %s --token %s --discovery-token-ca-cert-hash %s\n",
					cp.Config.APIServer.Endpoint, tok.String(), cp.PKI.CAPin())
			}
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the token lives (default: bootstrapTokens.ttl of cluster.yaml)")
	cmd.Flags().StringVar(&description, "description", "", "stored with the token")
	cmd.Flags().StringSliceVar(&groups, "groups", nil, "auth-extra-groups (default system:bootstrappers:kubeadm:default-node-token)")
	cmd.Flags().BoolP("verbose", "v", false, "also print the kubeadm join command line on stderr")
	return cmd
}

func newTokenListCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "list --dir DIR",
		Short: "List bootstrap tokens",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, client, _, err := adminClients(dir)
			if err != nil {
				return err
			}
			toks, err := joinconfig.ListTokens(cmd.Context(), client)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tEXPIRES\tUSAGES\tGROUPS\tDESCRIPTION")
			for _, t := range toks {
				exp := "never"
				if !t.Expires.IsZero() {
					exp = t.Expires.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, exp, strings.Join(t.Usages, ","), strings.Join(t.Groups, ","), t.Description)
			}
			return tw.Flush()
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

func newTokenRevokeCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "revoke --dir DIR TOKEN-ID",
		Short: "Delete a bootstrap token; waits until the apiserver refuses it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cp, err := controlplane.Open(dir)
			if err != nil {
				return err
			}
			id, _, _ := strings.Cut(args[0], ".")
			if err := cp.RevokeToken(cmd.Context(), id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bootstrap token %s revoked\n", id)
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

func newJoinConfigCommand() *cobra.Command {
	var dir, outDir string
	cmd := &cobra.Command{
		Use:   "join-config --dir DIR --out OUT",
		Short: "Write OUT/enroller.kubeconfig, the credential gpuboot mints bootstrap tokens and taints Nodes with",
		Long: `join-config issues a client certificate for the enroller identity (gpurack:enroller)
from the cluster CA and writes OUT/enroller.kubeconfig (docs/contracts.md §4). Its server is the
endpoint nodes use (apiServer.endpoint) and it trusts the cluster CA. The identity may only
create and delete bootstrap-token Secrets in kube-system, and get, list, watch, patch and
delete Nodes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, err := controlplane.Open(dir)
			if err != nil {
				return err
			}
			data, err := joinconfig.EnrollerKubeconfig(cp.Config, cp.PKI)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(outDir, 0o700); err != nil {
				return err
			}
			path := filepath.Join(outDir, joinconfig.EnrollerKubeconfigFile)
			if err := atomicfile.WriteMkdirAll(path, data, 0o600, 0o755); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (server %s, CA %s)\n", path, cp.Config.EndpointURL(), cp.PKI.CAPin())
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().StringVar(&outDir, "out", "", "directory to write enroller.kubeconfig into")
	cmd.MarkFlagRequired("out")
	return cmd
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

func newUploadCertsCommand() *cobra.Command {
	var dir string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "upload-certs --dir DIR [--ttl 2h]",
		Short: "Seal this host's CAs and keys for another control-plane host to join, and print its join command",
		Long: `upload-certs lets another host join this cluster as a control-plane host (docs/ha.md).

It seals the files every control-plane host shares (the cluster, front-proxy and etcd CAs
with their keys, the service-account key pair and the encryption key for Secrets) with a
new random certificate key (AES-256-GCM) into the Secret kube-system/` + controlplane.ControlPlaneCertsSecret + `,
creates a bootstrap token that may read that Secret and nothing else, and prints the
command to run on the new host. The certificate key is printed, never stored: keep it
secret, like the token. The token and the Secret are deleted together when the token
expires (--ttl). Running it again replaces the Secret: the last key printed is the one
that opens it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, err := controlplane.Open(dir)
			if err != nil {
				return err
			}
			if !cp.Config.HA() {
				return fmt.Errorf("controlPlane.hosts is %d in %s's cluster.yaml: set it to 3 (or 5) and run init again, on this host first, so that its controller-manager and scheduler elect a leader before another host runs them (docs/ha.md)", cp.Config.ControlPlane.Hosts, dir)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			up, err := cp.UploadCerts(ctx, ttl)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "shared certificates sealed into kube-system/%s; token and certificate key valid until %s\n", controlplane.ControlPlaneCertsSecret, up.Expires.UTC().Format(time.RFC3339))
			fmt.Fprintf(out, "on the new host, with its own cluster.yaml (nodeName, addresses; controlPlane.hosts as here):\n  %s\n", up.JoinCommand())
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().DurationVar(&ttl, "ttl", controlplane.UploadCertsTTL, "how long the token and the sealed certificates live")
	return cmd
}

func newJoinCommand() *cobra.Command {
	var dir, configPath string
	var foreground, controlPlane bool
	var timeout time.Duration
	var jo controlplane.JoinOptions
	cmd := &cobra.Command{
		Use:   "join --control-plane --server HOST:PORT --token TOKEN --ca-cert-hash sha256:HEX --certificate-key KEY --config cluster.yaml --dir DIR [--foreground]",
		Short: "Make this host another control-plane host of a cluster (etcd member, API server, controller-manager, scheduler)",
		Long: `join --control-plane makes this host a control-plane host of the cluster that --server
belongs to, with what upload-certs printed on one of its hosts (docs/ha.md).

It checks, before it writes anything: that the cluster's CA has --ca-cert-hash and
signed cluster-info for --token; that --certificate-key opens the shared certificates;
and that every etcd member answers and the cluster has fewer members than
controlPlane.hosts. Then it writes the shared CAs into DIR/pki, issues this host's own
certificates from them, adds this host's etcd member as a learner and starts the
components as init does; the member is promoted to a voting member once it has caught
up. If starting fails, the member is removed again.

--config is this host's cluster.yaml: its own nodeName, advertiseAddress and ports, and
the same clusterName, networking and controlPlane.hosts as the other hosts. Nodes join
through gpuboot, not this command.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !controlPlane {
				return errors.New("join joins control-plane hosts only: give --control-plane (nodes join through gpuboot)")
			}
			if configPath == "" {
				return errors.New("--config is required: this host's cluster.yaml")
			}
			opts, err := controlPlaneOptions(cmd, dir, configPath, foreground, timeout)
			if err != nil {
				return err
			}
			return superviseControlPlane(cmd, dir, foreground, func(ctx context.Context, logf func(string, ...any)) (*controlplane.ControlPlane, error) {
				opts.Logf = logf
				jo.Options = opts
				return controlplane.JoinControlPlane(ctx, jo)
			})
		},
	}
	cmd.Flags().BoolVar(&controlPlane, "control-plane", false, "join as a control-plane host (required)")
	cmd.Flags().StringVar(&jo.Server, "server", "", "an API server of the cluster, HOST:PORT (upload-certs prints it)")
	cmd.Flags().StringVar(&jo.Token, "token", "", "the bootstrap token upload-certs printed")
	cmd.Flags().StringVar(&jo.CAPin, "ca-cert-hash", "", "the cluster CA's pin, sha256:HEX")
	cmd.Flags().StringVar(&jo.CertificateKey, "certificate-key", "", "the key upload-certs printed, which opens the shared certificates")
	cmd.Flags().StringVar(&configPath, "config", "", "this host's cluster.yaml")
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&foreground, "foreground", false, "run the components as supervised child processes of this command")
	cmd.Flags().DurationVar(&timeout, "ready-timeout", 3*time.Minute, "how long to wait for each component to become healthy")
	for _, f := range []string{"server", "token", "ca-cert-hash", "certificate-key"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/server"
)

const defaultStateDir = "/var/lib/gpuboot"

func newInitCommand() *cobra.Command {
	var o server.InitOptions
	var advertise string
	cmd := &cobra.Command{
		Use:   "init --advertise HOST,IP,… [--state-dir DIR] [--rack NAME]…",
		Short: "Create the gpurack CA, the server certificate, per-rack gossip keys and a first operator certificate",
		Long: `init creates gpuboot's state directory once (CONTRACTS §4):
  pki/ca.crt, pki/ca.key          the gpurack CA (separate from the cluster CA)
  pki/server.crt, pki/server.key  gpuboot's serving certificate, SANs from --advertise
                                  (plus localhost and 127.0.0.1 for the local CLI)
  gossip/RACK.key                 one memberlist key per --rack
  operators/NAME/                 the first operator's credentials (--operator), an admin
It refuses to run over an existing CA.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Advertise = advertiseHosts(advertise)
			res, err := server.Init(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "gpurack CA created in %s\n", filepath.Join(o.StateDir, "pki"))
			fmt.Fprintf(out, "CA pin (gpurack.enroll.ca): %s\n", res.CAPin)
			fmt.Fprintf(out, "server certificate: %s\n", res.ServerCert)
			for _, k := range res.GossipKeys {
				fmt.Fprintf(out, "gossip key: %s\n", k)
			}
			fmt.Fprintf(out, "operator credentials: %s (use with --credentials)\n", res.OperatorDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.StateDir, "state-dir", defaultStateDir, "gpuboot's state directory (stateDir in gpuboot.yaml)")
	cmd.Flags().StringVar(&advertise, "advertise", "", "comma-separated host names and IP addresses machines reach gpuboot at (required)")
	cmd.Flags().StringSliceVar(&o.Racks, "rack", []string{"r1"}, "rack names to create gossip keys for")
	cmd.Flags().StringVar(&o.Operator, "operator", "admin", "name of the first operator certificate")
	cmd.MarkFlagRequired("advertise")
	return cmd
}

func newServeCommand() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "serve --config gpuboot.yaml",
		Short: "Serve DHCP, TFTP, HTTP boot, enrollment and the operator API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			var level slog.Level
			_ = level.UnmarshalText([]byte(cfg.LogLevel))
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = server.Run(ctx, cfg, log)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&path, "config", "/etc/gpuboot/gpuboot.yaml", "configuration file (see docs/examples/gpuboot.yaml)")
	return cmd
}

// advertiseHosts splits --advertise's comma-separated host names and addresses,
// dropping blanks.
func advertiseHosts(advertise string) []string {
	var hosts []string
	for _, h := range strings.Split(advertise, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

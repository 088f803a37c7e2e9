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
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
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
			for _, h := range strings.Split(advertise, ",") {
				if h = strings.TrimSpace(h); h != "" {
					o.Advertise = append(o.Advertise, h)
				}
			}
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

func newCertsCommand() *cobra.Command {
	certs := &cobra.Command{Use: "certs", Short: "Issue certificates from the gpurack CA"}
	var stateDir, out string
	var token bool
	var tokenTTL time.Duration
	var levelName string
	op := &cobra.Command{
		Use:   "operator NAME [--level viewer|operator|admin]",
		Short: "Issue an operator certificate (O=gpurack:operators) for AdminService, the REST API and the rack view",
		Long: `Issue an operator certificate at a level (in the certificate; the levels nest):
  viewer    reads: machines, history, rack reports, gossip key status, the REST API
            and the rack view; on an agent, its status, GPUs and events (the default)
  operator  also decides on machines: approve, reject, decommission, resolve a
            conflict, rotate a rack's gossip key; on an agent, run checks
  admin     also manages operators: revoke one, read the revocation audit
            (gpuboot operators audit); on a simulated agent, inject faults
The first operator gpuboot init makes is an admin. A certificate issued before levels
carries none and counts as an admin's: revoke it and issue one at the level needed.
To change an operator's level, revoke NAME (gpuboot operators revoke NAME, which
revokes every certificate recorded for the name), then issue NAME again at the new level.
A --token acts as a viewer whatever --level says: tokens reach only the read-only REST
API and rack view.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			level, err := pki.ParseOperatorLevel(levelName)
			if err != nil {
				return fmt.Errorf("--level: %w", err)
			}
			if out == "" {
				out = filepath.Join(stateDir, "operators", name)
			}
			if err := server.IssueOperator(stateDir, name, level, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "operator %s (level %s): credentials in %s (ca.crt, operator.crt, operator.key)\n", name, level.Name(), out)
			if token {
				if tokenTTL <= 0 {
					return fmt.Errorf("--token-ttl %s: tokens expire; give a positive duration", tokenTTL)
				}
				expires := time.Now().Add(tokenTTL)
				tok, line, err := admin.NewToken(name, expires)
				if err != nil {
					return err
				}
				f, err := os.OpenFile(filepath.Join(stateDir, "operator-tokens"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return err
				}
				defer f.Close()
				if _, err := f.WriteString(line); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "operator token (shown once; valid until %s; gpuboot serve picks it up within a second): %s\n", expires.UTC().Format(time.RFC3339), tok)
			}
			return nil
		},
	}
	op.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "gpuboot's state directory holding pki/ca.key")
	op.Flags().StringVar(&out, "out", "", "directory for the credentials (default STATEDIR/operators/NAME)")
	op.Flags().StringVar(&levelName, "level", pki.LevelViewer.Name(), "what the certificate may do: viewer, operator or admin")
	op.Flags().BoolVar(&token, "token", false, "also create a bearer token for the REST API and rack view (it acts as a viewer)")
	op.Flags().DurationVar(&tokenTTL, "token-ttl", admin.DefaultTokenTTL, "how long the token is valid")
	certs.AddCommand(op)
	return certs
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

package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/agent/apilb"
)

// apilbFlags are apilb's flags.
type apilbFlags struct {
	listen, ca          string
	upstreams           []string
	interval, timeout   time.Duration
	logLevel, logFormat string
}

func newAPILBCommand() *cobra.Command {
	var f apilbFlags
	cmd := &cobra.Command{
		Use:   "apilb --upstream HOST:PORT [--upstream HOST:PORT...] --ca FILE",
		Short: "Run the node's local load balancer over the cluster's API servers (127.0.0.1:7445)",
		Long: `apilb listens on --listen and passes each connection, TLS untouched, to one of the API
servers given with --upstream that answers /readyz (checked every --interval, verified with
--ca). When an API server stops answering, the connections through it are closed, so that
kubelet and the node's services reconnect at once to another. A node whose agent runs
kubelet starts this as the transient unit gpurack-apilb.service, so that it outlives
agent restarts, and points kubelet at it (docs/ha.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd.Context()) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7445", "address to listen on")
	fs.StringArrayVar(&f.upstreams, "upstream", nil, "an API server as HOST:PORT (repeat for each)")
	fs.StringVar(&f.ca, "ca", "", "PEM file of the cluster CA, which verifies the API servers' /readyz")
	fs.DurationVar(&f.interval, "interval", time.Second, "how often each API server's /readyz is checked")
	fs.DurationVar(&f.timeout, "timeout", time.Second, "limit on each check and each connection to an API server")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	return cmd
}

func (f *apilbFlags) run(ctx context.Context) error {
	if f.ca == "" {
		return fmt.Errorf("--ca: give the cluster CA's PEM file, which verifies the API servers")
	}
	pem, err := os.ReadFile(f.ca)
	if err != nil {
		return fmt.Errorf("--ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--ca %s: no PEM certificate in it", f.ca)
	}
	log, err := (&backendFlags{logLevel: f.logLevel, logFormat: f.logFormat}).logger()
	if err != nil {
		return err
	}
	b, err := apilb.New(apilb.Config{Listen: f.listen, Upstreams: f.upstreams, RootCAs: pool, Interval: f.interval, Timeout: f.timeout, Log: log})
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("API load balancer listening", "address", b.Addr().String(), "upstreams", f.upstreams)
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("sd_notify READY", "error", err)
	}
	return b.Serve(ctx)
}

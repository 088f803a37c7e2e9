package logsgateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
)

// Command is the subcommand of controlplane-bootstrap that runs the gateway; the
// supervisor starts `controlplane-bootstrap logs-gateway --flags`, and a test binary
// that starts a control plane with logs answers it in TestMain (testcluster.Main).
const Command = "logs-gateway"

// Main runs the gateway with the command-line flags args (after Command) until ctx
// ends. Usage and errors go to stderr; the error says what to fix.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "HOST:PORT to serve nodes on, with TLS (required)")
	upstream := fs.String("upstream", "", "VictoriaLogs' base URL on loopback, for example http://127.0.0.1:9429 (required)")
	certFile := fs.String("cert-file", "", "the gateway's serving certificate, PEM (required)")
	keyFile := fs.String("key-file", "", "its private key, PEM (required)")
	caFile := fs.String("client-ca-file", "", "the cluster CA, which signs the nodes' (kubelet's) client certificates (required)")
	maxBytes := fs.Int64("max-request-bytes", DefaultMaxRequestBytes, "largest body accepted as sent; 413 beyond, nothing stored")
	maxConc := fs.Int("max-concurrent-requests", DefaultMaxConcurrent, "requests read or forwarded at once; more wait, then 429")
	perNode := fs.Int("max-requests-per-node", DefaultMaxPerNode, "requests of one node at once; more are 429")
	metricsUser := fs.String("metrics-user", "", "client certificate CN that may read /metrics (gpurack:monitoring)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: controlplane-bootstrap %s --listen HOST:PORT --upstream URL --cert-file F --key-file F --client-ca-file F

Runs the log store's ingestion gateway (docs/contracts.md §15): nodes POST JSON lines to
/insert/jsonline with kubelet's client certificate, and the gateway forwards them to
VictoriaLogs with node=NAME from the certificate. init runs it as a supervised component
(monitoring.logs in cluster.yaml); it is not meant to be run by hand.

Flags:
`, Command)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	for _, f := range []struct{ name, v string }{{"listen", *listen}, {"upstream", *upstream}, {"cert-file", *certFile}, {"key-file", *keyFile}, {"client-ca-file", *caFile}} {
		if f.v == "" {
			return fmt.Errorf("--%s is required (see --help)", f.name)
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return fmt.Errorf("serving certificate: %w (init writes it: run init again)", err)
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		return fmt.Errorf("client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("client CA %s holds no PEM certificate", *caFile)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	logger := log.New(stderr, "", log.LstdFlags|log.LUTC)
	g := New(Config{Upstream: *upstream, MaxRequestBytes: *maxBytes, MaxConcurrent: *maxConc, MaxPerNode: *perNode,
		MetricsUser: *metricsUser, Logf: logger.Printf})
	logger.Printf("logs gateway on https://%s, forwarding to %s (at most %d bytes a request, %d at once, %d a node)",
		ln.Addr(), *upstream, *maxBytes, *maxConc, *perNode)
	err = Serve(ctx, ln, TLSConfig(cert, pool), g)
	logger.Printf("logs gateway stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

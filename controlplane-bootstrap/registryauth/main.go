package registryauth

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"
)

// Command is the subcommand of controlplane-bootstrap that runs the issuer; the
// supervisor starts `controlplane-bootstrap registry-auth --flags`.
const Command = "registry-auth"

// Main runs the issuer with the command-line flags args (after Command) until ctx
// ends. Usage and errors go to stderr; the error says what to fix.
func Main(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "HOST:PORT to serve on, with TLS (required; the registry's realm names port 5001)")
	certFile := fs.String("cert", "", "serving certificate, PEM: the registry's, pki/registry.crt (required)")
	keyFile := fs.String("key", "", "its private key, PEM (required)")
	signingCert := fs.String("signing-cert", "", "token signing certificate, pki/"+SigningCertFile+" (required)")
	signingKey := fs.String("signing-key", "", "token signing key, pki/"+SigningKeyFile+" (required)")
	usersFile := fs.String("users-file", "", "the tenant users' credentials, DIR/users/credentials.json (required)")
	robotsFile := fs.String("robots-file", "", "the tenants' pull credentials, DIR/"+RobotsFile+" (required)")
	service := fs.String("service", Service, "the registry's service name, the tokens' audience")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: controlplane-bootstrap %s --listen HOST:PORT --cert F --key F --signing-cert F --signing-key F --users-file F --robots-file F

Runs the image registry's token issuer (docs/contracts.md, "Image registry tokens"):
clients authenticate with HTTP Basic (a tenant user's registry password, or a tenant's
pull credential) at GET /token and get a JWT for the registry, limited to their
tenant's repositories. init runs it as a supervised component beside the registry; it
is not meant to be run by hand.

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
	for _, f := range []struct{ name, v string }{{"listen", *listen}, {"cert", *certFile}, {"key", *keyFile},
		{"signing-cert", *signingCert}, {"signing-key", *signingKey}, {"users-file", *usersFile}, {"robots-file", *robotsFile}} {
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
	key, sc, err := LoadSigningKey(*signingKey, *signingCert)
	if err != nil {
		return err
	}
	minter, err := NewMinter(key, sc)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	logger := log.New(stderr, "", log.LstdFlags|log.LUTC)
	h := &Handler{Service: *service, UsersFile: *usersFile, RobotsFile: *robotsFile, Minter: minter, Logf: logger.Printf}
	logger.Printf("registry token issuer on https://%s/token for service %s (users %s, pull credentials %s)", ln.Addr(), *service, *usersFile, *robotsFile)
	err = Serve(ctx, ln, cert, h)
	logger.Printf("registry token issuer stopped")
	return err
}

// Serve serves h with TLS (cert) on ln until ctx ends, then shuts down; it returns nil
// after a shutdown by ctx.
func Serve(ctx context.Context, ln net.Listener, cert tls.Certificate, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
		case <-done:
		}
	}()
	err := srv.ServeTLS(ln, "", "")
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

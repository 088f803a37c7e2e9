package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpurack/gpurack/controlplane-bootstrap/vip"
)

// vipFlags are the vip command's flags.
type vipFlags struct {
	address, iface            string
	etcd                      []string
	etcdCA, etcdCert, etcdKey string
	name                      string
	ttl                       time.Duration
	healthListen              string
}

func newVIPCommand() *cobra.Command {
	var f vipFlags
	cmd := &cobra.Command{
		Use:   "vip --address CIDR --interface NAME --etcd URL [--etcd URL]... [--etcd-ca F --etcd-cert F --etcd-key F] [--name NAME] [--ttl 5s] [--health-listen HOST:PORT]",
		Short: "Hold the control plane's floating API address on one control-plane host at a time",
		Long: `vip keeps one IPv4 address, the control plane's API address, on exactly one of the
control-plane hosts, so that nodes and users reach the API at that address whichever
host is up.

Run it on every control-plane host, under systemd or another supervisor, with the same
--address and the etcd cluster's client URLs. The hosts campaign in an etcd election
(key prefix /gpurack/vip/ADDRESS, value --name). The winner adds the address to
--interface and announces it with gratuitous ARP (three times a second apart, then
every 10s), so that the neighbours' ARP caches point at it at once.

The holder deletes the address when its etcd session is lost (etcd unreachable for
--ttl), then campaigns again. On SIGTERM or SIGINT it deletes the address, resigns and
revokes its lease, so that another host takes over at once; a host that dies without
stopping is replaced after --ttl. At start, vip deletes the address from --interface
if an earlier run that was killed left it there.

--address is the floating address with the prefix length of its subnet. It must be free
(no host's own address), kube-apiserver must listen on it (or on all addresses), and
its serving certificate must name it. Only IPv4 is supported yet.

It logs when it takes and releases the address ("took the API address", "released the
API address") to stderr, and runs until SIGTERM or SIGINT.

With --health-listen it serves plain HTTP there (keep it on loopback): GET /healthz
answers 200 "ok" while it runs, and GET /leader the name of the host that holds the
address now, read from etcd (empty when none does; 503 with the reason when etcd
cannot be read). "controlplane-bootstrap init" runs it so, as the vip component, when
cluster.yaml has apiServer.vip (on 127.0.0.1:9446, apiServer.vip.healthPort); "status"
shows /leader.

Example, on each of three hosts whose cluster directory is DIR:
  controlplane-bootstrap vip --address 10.0.0.10/24 --interface eth0 \
    --etcd https://10.0.0.11:2379 --etcd https://10.0.0.12:2379 --etcd https://10.0.0.13:2379 \
    --etcd-ca DIR/pki/etcd/ca.crt --etcd-cert DIR/pki/apiserver-etcd-client.crt \
    --etcd-key DIR/pki/apiserver-etcd-client.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runVIP(cmd, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.address, "address", "", "the floating API address with its prefix length (10.0.0.10/24)")
	fl.StringVar(&f.iface, "interface", "", "the link to hold the address on (eth0)")
	fl.StringArrayVar(&f.etcd, "etcd", nil, "an etcd client URL (https://10.0.0.11:2379); repeat it for each member")
	fl.StringVar(&f.etcdCA, "etcd-ca", "", "PEM file of the CA that signed etcd's serving certificate (with --etcd-cert and --etcd-key)")
	fl.StringVar(&f.etcdCert, "etcd-cert", "", "PEM file of an etcd client certificate (with --etcd-ca and --etcd-key)")
	fl.StringVar(&f.etcdKey, "etcd-key", "", "PEM file of that certificate's private key (with --etcd-ca and --etcd-cert)")
	fl.StringVar(&f.name, "name", "", "this host's name in the election (default: the host name)")
	fl.DurationVar(&f.ttl, "ttl", vip.DefaultTTL, "etcd session TTL, whole seconds: how long a lost holder keeps the address's election")
	fl.StringVar(&f.healthListen, "health-listen", "", "HOST:PORT to serve GET /healthz and GET /leader on, plain HTTP (127.0.0.1:9446); empty: none")
	for _, name := range []string{"address", "interface", "etcd"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}

// runVIP checks the flags and runs vip.Run until the command's context ends (SIGTERM
// or SIGINT).
func runVIP(cmd *cobra.Command, f *vipFlags) error {
	address, err := netip.ParsePrefix(f.address)
	if err != nil {
		return fmt.Errorf("--address %q: give the floating address with its prefix length, such as 10.0.0.10/24", f.address)
	}
	tlsConfig, err := f.etcdTLS()
	if err != nil {
		return err
	}
	cfg := vip.Config{
		Address:   address,
		Interface: f.iface,
		Endpoints: f.etcd,
		TLS:       tlsConfig,
		Name:      f.name,
		TTL:       f.ttl,
		Log:       slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)),
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w\n(the fields are the flags: Address is --address, Interface --interface, Endpoints --etcd, TLS --etcd-ca/--etcd-cert/--etcd-key, TTL --ttl)", err)
	}
	if f.healthListen == "" {
		return vip.Run(cmd.Context(), cfg)
	}
	// What vip.Run checks first, before /healthz can say ok: a missing interface is
	// an exit, not a healthy holder that never holds.
	if _, err := net.InterfaceByName(cfg.Interface); err != nil {
		return fmt.Errorf("--interface %s: %w (`ip link` lists this host's links)", cfg.Interface, err)
	}
	ln, err := net.Listen("tcp", f.healthListen)
	if err != nil {
		return fmt.Errorf("--health-listen %s: %w", f.healthListen, err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, TLS: cfg.TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		ln.Close()
		return fmt.Errorf("etcd client for /leader: %w", err)
	}
	defer cli.Close()
	leader := func(ctx context.Context) (string, error) { return vip.Leader(ctx, cli, address) }
	return runWithHealth(cmd.Context(), ln, leader, cfg.Log, func(ctx context.Context) error { return vip.Run(ctx, cfg) })
}

// runWithHealth serves vipHealthHandler on ln while run runs, and returns run's error.
func runWithHealth(ctx context.Context, ln net.Listener, leader func(context.Context) (string, error), log *slog.Logger, run func(context.Context) error) error {
	srv := &http.Server{Handler: vipHealthHandler(leader), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the health listener stopped", "listen", ln.Addr().String(), "err", err)
		}
	}()
	err := run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	<-served
	return err
}

// leaderTimeout bounds one /leader request's read from etcd.
const leaderTimeout = 3 * time.Second

// vipHealthHandler answers GET /healthz with "ok" and GET /leader with the holder's
// name from leader ("" when none holds the address; 503 with the reason when leader
// fails), in plain text.
func vipHealthHandler(leader func(context.Context) (string, error)) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("GET /leader", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), leaderTimeout)
		defer cancel()
		name, err := leader(ctx)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		if name != "" {
			fmt.Fprintln(w, name)
		}
	})
	return mux
}

// etcdTLS loads --etcd-ca, --etcd-cert and --etcd-key into an etcd client TLS
// config; nil if none is given.
func (f *vipFlags) etcdTLS() (*tls.Config, error) {
	given := 0
	for _, p := range []string{f.etcdCA, f.etcdCert, f.etcdKey} {
		if p != "" {
			given++
		}
	}
	switch given {
	case 0:
		return nil, nil
	case 3:
	default:
		return nil, errors.New("give all of --etcd-ca, --etcd-cert and --etcd-key (for https etcd URLs), or none (for plain http)")
	}
	caPEM, err := os.ReadFile(f.etcdCA)
	if err != nil {
		return nil, fmt.Errorf("--etcd-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--etcd-ca %s: no PEM certificate in it", f.etcdCA)
	}
	cert, err := tls.LoadX509KeyPair(f.etcdCert, f.etcdKey)
	if err != nil {
		return nil, fmt.Errorf("--etcd-cert %s and --etcd-key %s: %w", f.etcdCert, f.etcdKey, err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

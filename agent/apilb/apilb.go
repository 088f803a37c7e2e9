// Package apilb is the node's local load balancer for the Kubernetes API. gpuagent
// runs it on 127.0.0.1:7445, over all of the cluster's apiservers (as Talos' KubePrism
// and k3s' agent load balancer do), and kubelet, kube-proxy and the pod network reach
// the API through it, so that a node depends neither on any one apiserver nor on the
// control plane's virtual IP (issue 31).
//
// It works at layer 4: it copies bytes between each client connection and one
// apiserver connection and never terminates TLS. Clients verify the apiserver's own
// certificate (which lists 127.0.0.1 among its names) and authenticate to it end to end
// with their own credentials; the balancer holds no key and sees no request.
//
// Every Interval it checks each apiserver's /readyz over HTTPS, and it sends each new
// connection round-robin to the apiservers that passed. When an apiserver fails a check
// the balancer closes every connection spliced to it, so that clients (kubelet's
// long-lived HTTP/2 connections among them) reconnect through it at once, to a ready
// apiserver, instead of waiting for their own timeouts. Failover is so bounded by
// Interval+Timeout (the check that notices) plus the client's reconnect. A failed dial
// marks its apiserver unhealthy at once and the next one is tried.
package apilb

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Config.Interval and Config.Timeout.
const (
	defaultInterval = time.Second
	defaultTimeout  = time.Second
)

// Config is what New needs to run a balancer.
type Config struct {
	Listen    string         // address to listen on, e.g. "127.0.0.1:7445" ("127.0.0.1:0" in tests)
	Upstreams []string       // host:port of each apiserver, at least one; duplicates refused
	RootCAs   *x509.CertPool // verifies the apiservers' certificates in the health checks; required
	Interval  time.Duration  // health check period for each upstream (0: 1s)
	Timeout   time.Duration  // limit on each health check and each upstream dial (0: 1s)
	Log       *slog.Logger   // nil: slog.Default()
}

// UpstreamStatus is one upstream as the balancer sees it.
type UpstreamStatus struct {
	Address string
	// Healthy is the outcome of the last health check or dial; before the first of
	// them it is true, since an upstream is assumed healthy until shown otherwise.
	Healthy bool
	Active  int // client connections spliced to it now
	// LastError is the error of the last failed health check (or dial) while it is
	// unhealthy, "" when healthy.
	LastError string
}

// Balancer is a running load balancer: New makes it and listens, Serve runs it.
type Balancer struct {
	ln       net.Listener
	ups      []*upstream
	interval time.Duration
	dialer   net.Dialer
	log      *slog.Logger
	served   atomic.Bool // Serve has been called

	mu      sync.Mutex // guards the fields below and each upstream's mutable state
	next    uint64     // round-robin counter over the healthy upstreams
	closing bool       // Serve is ending: no new links may be registered
}

// upstream is one apiserver and what the balancer knows of it.
type upstream struct {
	addr   string       // as in Config.Upstreams
	client *http.Client // for its health checks, with the TLS ServerName set to its host

	// Guarded by Balancer.mu.
	healthy bool   // last outcome; true before any (assumed healthy)
	known   bool   // a check or dial has finished, so healthy is no longer assumed
	lastErr string // the error that made it unhealthy, "" when healthy
	downs   uint64 // healthy→unhealthy changes, so a dial can tell it went down meanwhile
	links   map[*link]struct{}
}

// New checks cfg, listens on cfg.Listen and returns the balancer, which does nothing
// more until Serve. Its errors name the Config field at fault.
func New(cfg Config) (*Balancer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	timeout := cmp.Or(cfg.Timeout, defaultTimeout)
	b := &Balancer{
		interval: cmp.Or(cfg.Interval, defaultInterval),
		dialer:   net.Dialer{Timeout: timeout},
		log:      cmp.Or(cfg.Log, slog.Default()),
	}
	for _, addr := range cfg.Upstreams {
		host, _, _ := net.SplitHostPort(addr) // validate has parsed it
		b.ups = append(b.ups, &upstream{
			addr:    addr,
			client:  checkClient(cfg.RootCAs, host, timeout),
			healthy: true,
			links:   map[*link]struct{}{},
		})
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("apilb: listen on Config.Listen %q: %w", cfg.Listen, err)
	}
	b.ln = ln
	return b, nil
}

// validate reports the first problem with c, naming the field.
func (c *Config) validate() error {
	if c.Listen == "" {
		return errors.New("apilb: Config.Listen is empty; want an address such as 127.0.0.1:7445")
	}
	if len(c.Upstreams) == 0 {
		return errors.New("apilb: Config.Upstreams is empty; want at least one apiserver host:port")
	}
	seen := map[string]int{}
	for i, addr := range c.Upstreams {
		key, err := upstreamKey(addr)
		if err != nil {
			return fmt.Errorf("apilb: Config.Upstreams[%d] %q is not host:port: %w", i, addr, err)
		}
		if j, ok := seen[key]; ok {
			return fmt.Errorf("apilb: Config.Upstreams[%d] %q is a duplicate of Upstreams[%d] %q", i, addr, j, c.Upstreams[j])
		}
		seen[key] = i
	}
	if c.RootCAs == nil {
		return errors.New("apilb: Config.RootCAs is nil; the health checks need it to verify the apiservers' certificates")
	}
	if c.Interval < 0 {
		return fmt.Errorf("apilb: Config.Interval %v is negative", c.Interval)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("apilb: Config.Timeout %v is negative", c.Timeout)
	}
	return nil
}

// upstreamKey parses addr as host:port, with a non-empty host and a numeric port, and
// returns it in a canonical form (IP addresses normalized, names lower-cased, the port
// without leading zeros), so that two spellings of one upstream count as duplicates.
func upstreamKey(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host == "" {
		return "", errors.New("the host is empty")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", fmt.Errorf("the port %q is not a number from 1 to 65535", port)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	return net.JoinHostPort(strings.ToLower(host), strconv.FormatUint(n, 10)), nil
}

// Addr is the address the balancer listens on (with the port chosen, when
// Config.Listen asked for port 0).
func (b *Balancer) Addr() net.Addr { return b.ln.Addr() }

// Serve runs the health checks and accepts and splices connections until ctx ends; it
// then closes the listener and every spliced connection, waits for its goroutines,
// and returns nil. It returns an error only when called a second time or when the
// listener fails for good. A Balancer is served once.
func (b *Balancer) Serve(ctx context.Context) error {
	if !b.served.CompareAndSwap(false, true) {
		return errors.New("apilb: Serve called more than once")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, u := range b.ups {
		wg.Go(func() { b.watch(ctx, u) })
	}
	stop := context.AfterFunc(ctx, func() { b.ln.Close() }) // ends the blocked Accept
	defer stop()
	err := b.accept(ctx, &wg)
	cancel()
	b.ln.Close()
	b.closeAll()
	wg.Wait()
	return err
}

// accept takes client connections until ctx ends, handing each to its own goroutine
// in wg. A transient Accept error (such as running out of file descriptors) is logged
// and retried after a growing pause, as net/http does; a closed listener while ctx is
// live is an error.
func (b *Balancer) accept(ctx context.Context, wg *sync.WaitGroup) error {
	var pause time.Duration
	for {
		conn, err := b.ln.Accept()
		if ctx.Err() != nil {
			if conn != nil {
				conn.Close()
			}
			return nil
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("apilb: listener closed: %w", err)
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			b.log.Warn("apiserver load balancer: accept failed; retrying", "error", err, "pause", pause)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		wg.Go(func() { b.handle(ctx, conn) })
	}
}

// closeAll stops new links from being registered and closes every spliced connection,
// both sides, as Serve ends.
func (b *Balancer) closeAll() {
	b.mu.Lock()
	b.closing = true
	var all []*link
	for _, u := range b.ups {
		for l := range u.links {
			all = append(all, l)
		}
	}
	b.mu.Unlock()
	for _, l := range all {
		l.close()
	}
}

// Status reports each upstream, in Config.Upstreams order.
func (b *Balancer) Status() []UpstreamStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]UpstreamStatus, 0, len(b.ups))
	for _, u := range b.ups {
		out = append(out, UpstreamStatus{
			Address:   u.addr,
			Healthy:   u.healthy,
			Active:    len(u.links),
			LastError: u.lastErr,
		})
	}
	return out
}

// Package vip holds a floating IPv4 address, the control plane's API address, on
// exactly one control-plane host at a time, as Talos' VIP does.
//
// Every control-plane host runs Run (`controlplane-bootstrap vip`) with the same
// address. The hosts campaign in an etcd election under /gpurack/vip/<address>, each
// with its own name as the value. The winner adds the address to its interface with
// netlink and announces it with gratuitous ARP, three times a second apart and then
// every 10 seconds while it holds it, so that the neighbours' ARP caches point at it
// at once and stay so. Clients therefore reach the API at one address whichever host
// holds it.
//
// A holder deletes the address when its etcd session is lost (etcd unreachable for
// the session's TTL), when it is no longer the leader, and when its context ends.
// After a lost session it campaigns again with a new session. On a clean stop it
// also resigns and revokes its lease, so that another host takes over at once
// instead of after the TTL. A host that dies without stopping (power, network,
// SIGKILL) is replaced once its lease expires, after the TTL; if it comes back with
// the address still on its interface, Run deletes the address before campaigning.
//
// Only IPv4 is supported: an IPv6 address would need NDP announcements instead of ARP.
package vip

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultTTL is the etcd session TTL when Config.TTL is zero: how long a lost holder
// keeps the election before another host takes over.
const DefaultTTL = 5 * time.Second

// keyPrefix is where the elections live in etcd; the address follows it.
const keyPrefix = "/gpurack/vip/"

// Timing of the holder's loop.
const (
	announceCount         = 3                      // gratuitous ARPs sent one announceFirstInterval apart on taking the address
	announceFirstInterval = time.Second            // the gap between those first announcements
	announceInterval      = 10 * time.Second       // the gap between later announcements while holding
	cleanupTimeout        = 2 * time.Second        // the limit of each of resign and revoke when a term ends
	grantTimeout          = 5 * time.Second        // the limit of granting a session's lease
	dialTimeout           = 5 * time.Second        // the etcd client's dial limit
	minBackoff            = 250 * time.Millisecond // the first wait before campaigning again
	maxBackoff            = 5 * time.Second        // the longest wait before campaigning again
	maxInterfaceName      = 15                     // IFNAMSIZ - 1
)

// Config says which address to hold, where, and how to reach etcd.
type Config struct {
	Address   netip.Prefix  // the floating address with its prefix length, e.g. 10.0.0.10/24
	Interface string        // the link to hold it on
	Endpoints []string      // etcd client URLs
	TLS       *tls.Config   // etcd client TLS; nil: plain http endpoints
	Name      string        // this host's name, the election value (default: os.Hostname)
	TTL       time.Duration // etcd session TTL (default 5s; whole seconds, at least 1s)
	Log       *slog.Logger  // where transitions are logged (default: slog.Default())
}

// Validate checks c and returns every problem, one a line, each naming its field
// ("vip: Address 2001:db8::10/64: IPv6 is not supported yet ..."). A zero TTL, Name
// or Log is valid: Run fills in the default.
func (c Config) Validate() error {
	var errs []error
	if err := validateAddress(c.Address); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.Interface == "":
		errs = append(errs, errors.New("vip: Interface: not set; name the link that is to hold the address, such as eth0"))
	case len(c.Interface) > maxInterfaceName:
		errs = append(errs, fmt.Errorf("vip: Interface %q: longer than %d bytes, so no Linux interface has that name", c.Interface, maxInterfaceName))
	}
	errs = append(errs, validateEndpoints(c.Endpoints, c.TLS != nil)...)
	switch {
	case c.TTL < 0 || (c.TTL > 0 && c.TTL < time.Second):
		errs = append(errs, fmt.Errorf("vip: TTL %v: less than 1s; etcd leases last whole seconds, at least one", c.TTL))
	case c.TTL%time.Second != 0:
		errs = append(errs, fmt.Errorf("vip: TTL %v: not whole seconds, which etcd leases count in", c.TTL))
	}
	return errors.Join(errs...)
}

// validateAddress checks that a is an IPv4 unicast address with a prefix length.
func validateAddress(a netip.Prefix) error {
	ip := a.Addr()
	switch {
	case !a.IsValid():
		return errors.New("vip: Address: not set or not valid; give the floating address with its prefix length, such as 10.0.0.10/24")
	case !ip.Is4():
		return fmt.Errorf("vip: Address %s: IPv6 is not supported yet (holding an IPv6 address needs NDP announcements, not ARP); give an IPv4 address", a)
	case ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("vip: Address %s: not a unicast address that a host can hold", a)
	case a.Bits() < 31 && ip == a.Masked().Addr():
		return fmt.Errorf("vip: Address %s: the network address of its prefix; give a host address inside it", a)
	}
	return nil
}

// validateEndpoints checks that every endpoint is an http or https URL with a host,
// https exactly when TLS is set.
func validateEndpoints(endpoints []string, haveTLS bool) []error {
	if len(endpoints) == 0 {
		return []error{errors.New("vip: Endpoints: none; give the etcd client URLs, such as https://10.0.0.11:2379")}
	}
	var errs []error
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
			errs = append(errs, fmt.Errorf("vip: Endpoints: %q is not an etcd client URL such as https://10.0.0.11:2379", ep))
		case u.Scheme == "https" && !haveTLS:
			errs = append(errs, fmt.Errorf("vip: Endpoints: %s is https but TLS is not set; give the etcd CA and a client certificate", ep))
		case u.Scheme == "http" && haveTLS:
			errs = append(errs, fmt.Errorf("vip: Endpoints: %s is plain http but TLS is set; write https://", ep))
		}
	}
	return errs
}

// withDefaults returns c with TTL, Name and Log filled in where they are zero.
func (c Config) withDefaults() (Config, error) {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Name == "" {
		name, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("vip: Name: not set, and this host's name cannot be read: %w", err)
		}
		c.Name = name
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c, nil
}

// electionPrefix is the election's key prefix for address.
func electionPrefix(address netip.Prefix) string {
	return keyPrefix + address.Addr().String()
}

// Run holds cfg.Address on cfg.Interface whenever this host wins the election, until
// ctx ends; then it lets go (deleting the address, resigning and revoking its lease)
// and returns nil. It returns an error at once if cfg is not valid, the interface
// does not exist, or the etcd client cannot be made; etcd being unreachable is not
// an error: Run waits for it and campaigns again.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if _, err := netlink.LinkByName(cfg.Interface); err != nil {
		return fmt.Errorf("vip: Interface %s: %w (`ip link` lists this host's links)", cfg.Interface, err)
	}
	h := &holder{cfg: cfg, log: cfg.Log.With("address", cfg.Address.String(), "interface", cfg.Interface)}
	if err := h.removeStale(); err != nil {
		return fmt.Errorf("vip: %w", err)
	}
	h.cli, err = clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         cfg.TLS,
		DialTimeout: dialTimeout,
		// Run logs what matters itself; the client's own log is retries and noise.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("vip: etcd client for %v: %w", cfg.Endpoints, err)
	}
	defer h.cli.Close()
	h.log.Info("campaigning for the API address", "name", cfg.Name, "etcd", cfg.Endpoints, "ttl", cfg.TTL)
	h.loop(ctx)
	return nil
}

// Leader returns the name of the current holder from etcd (for `status`), "" if none.
// The holder is the campaigner with the oldest key, as in etcd's election recipe; it
// may not have added the address yet.
func Leader(ctx context.Context, cli *clientv3.Client, address netip.Prefix) (string, error) {
	resp, err := cli.Get(ctx, electionPrefix(address)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("vip: read the holder of %s from etcd: %w", address.Addr(), err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

//go:build linux

package netnstest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// pollInterval is how often WaitPort retries.
const pollInterval = 50 * time.Millisecond

// WaitPort waits until something listens on addr ("host:port", host an IP
// literal or empty) in the caller's network namespace, or ctx is done.
//
// For "tcp", "tcp4" and "tcp6" it dials until a connection succeeds, then
// closes it; the server sees one empty connection. UDP has no handshake to
// try, so for "udp", "udp4" and "udp6" it sends nothing and instead waits
// until /proc/net/udp or /proc/net/udp6 lists a socket bound to addr's port
// on addr's IP or on the wildcard address. That only sees sockets in the
// caller's own namespace; for a server in another namespace use WaitPortIn.
func WaitPort(ctx context.Context, network, addr string) error {
	if err := waitPort(ctx, network, addr); err != nil {
		return fmt.Errorf("netnstest: %w", err)
	}
	return nil
}

// WaitPortIn is WaitPort run inside network namespace ns (see InNamespace).
func WaitPortIn(ctx context.Context, ns, network, addr string) error {
	var waitErr error
	if err := InNamespace(ns, func() error {
		waitErr = waitPort(ctx, network, addr)
		return nil
	}); err != nil {
		return err
	}
	if waitErr != nil {
		return fmt.Errorf("netnstest: in namespace %s: %w", ns, waitErr)
	}
	return nil
}

func waitPort(ctx context.Context, network, addr string) error {
	var try func() error
	switch network {
	case "tcp", "tcp4", "tcp6":
		try = func() error {
			d := net.Dialer{Timeout: time.Second}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return err
			}
			return conn.Close()
		}
	case "udp", "udp4", "udp6":
		want, err := parseUDPAddr(addr)
		if err != nil {
			return fmt.Errorf("wait for %s %s: %w", network, addr, err)
		}
		try = func() error { return udpBoundHere(want) }
	default:
		return fmt.Errorf("wait for %s %s: network must be tcp, tcp4, tcp6, udp, udp4 or udp6", network, addr)
	}
	var last error // the last try's reason, unless only the deadline cut it short
	for {
		err := try()
		if err == nil {
			return nil
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s %s: %w (last try: %v)", network, addr, context.Cause(ctx), last)
		case <-time.After(pollInterval):
		}
	}
}

// parseUDPAddr parses "ip:port" or ":port"; an empty host becomes the
// invalid netip.Addr, which matches any bound address.
func parseUDPAddr(addr string) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", portStr, err)
	}
	var ip netip.Addr
	if host != "" {
		if ip, err = netip.ParseAddr(host); err != nil {
			return netip.AddrPort{}, fmt.Errorf("host must be an IP literal: %w", err)
		}
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
}

// errNotBound is returned while no UDP socket is bound to the address.
var errNotBound = errors.New("no UDP socket bound")

// udpBoundHere checks the UDP socket tables of the calling thread's network
// namespace (/proc/thread-self, not /proc/self, which shows the main
// thread's namespace).
func udpBoundHere(want netip.AddrPort) error {
	for _, file := range []string{"/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"} {
		table, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(file, "6") {
			continue // IPv6 disabled
		}
		if err != nil {
			return err
		}
		bound, err := udpBound(table, want)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if bound {
			return nil
		}
	}
	return errNotBound
}

// udpBound reports whether a socket in table, the text of /proc/net/udp or
// /proc/net/udp6, is bound to want's port on want's address, or on the
// wildcard address, or (when want's address is invalid) on any address. A
// wildcard IPv6 socket also counts for IPv4 addresses, as dual-stack
// sockets accept both.
func udpBound(table []byte, want netip.AddrPort) (bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // header line
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		local, err := parseProcNetAddr(fields[1])
		if err != nil {
			return false, fmt.Errorf("line %q: %w", sc.Text(), err)
		}
		if local.Port() != want.Port() {
			continue
		}
		if !want.Addr().IsValid() || local.Addr().IsUnspecified() || local.Addr().Unmap() == want.Addr() {
			return true, nil
		}
	}
	return false, sc.Err()
}

// parseProcNetAddr parses a local_address field of /proc/net/udp{,6}, such
// as "0100007F:0035". The kernel prints the address as 32-bit words in host
// byte order and the port as a number.
func parseProcNetAddr(field string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(field, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q has no port", field)
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q is not 8 or 32 hex digits", ipHex)
	}
	ip := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", portHex, err)
	}
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

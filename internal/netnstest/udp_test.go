//go:build linux

package netnstest

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

func TestUDPBound(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		testreq.NotApplicable(t, "the sample /proc/net/udp lines are from a little-endian machine")
	}
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
	const (
		any67      = "  1: 00000000:0043 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1001 2 0000000000000000 0\n"
		local69    = "  2: 0100007F:0045 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1002 2 0000000000000000 0\n"
		testNet69  = "  3: 010200C0:0045 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1003 2 0000000000000000 0\n"
		v6Any4011  = "  4: 00000000000000000000000000000000:0FAB 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1004 2 0000000000000000 0\n"
		v6Doc53    = "  5: B80D0120000000000000000001000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1005 2 0000000000000000 0\n"
		v6Mapped69 = "  6: 0000000000000000FFFF0000020200C0:0045 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1006 2 0000000000000000 0\n"
	)
	ap := netip.MustParseAddrPort
	anyAddr := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.Addr{}, port) }
	for _, tc := range []struct {
		name  string
		table string
		want  netip.AddrPort
		bound bool
	}{
		{"wildcard socket matches any address", any67, ap("192.0.2.1:67"), true},
		{"wildcard socket, other port", any67, ap("192.0.2.1:68"), false},
		{"exact address", local69, ap("127.0.0.1:69"), true},
		{"other address on same port", local69, ap("192.0.2.1:69"), false},
		{"any address wanted", testNet69, anyAddr(69), true},
		{"second line matches", local69 + testNet69, ap("192.0.2.1:69"), true},
		{"IPv6 wildcard covers IPv4", v6Any4011, ap("192.0.2.1:4011"), true},
		{"IPv6 exact", v6Doc53, ap("[2001:db8::1]:53"), true},
		{"IPv6 other address", v6Doc53, ap("[2001:db8::2]:53"), false},
		{"IPv4-mapped socket matches IPv4", v6Mapped69, ap("192.0.2.2:69"), true},
		{"empty table", "", anyAddr(67), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bound, err := udpBound([]byte(header+tc.table), tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if bound != tc.bound {
				t.Errorf("udpBound(%s) = %v, want %v", tc.want, bound, tc.bound)
			}
		})
	}

	if _, err := udpBound([]byte(header+"  1: 0100007F 00000000:0000 07\n"), anyAddr(67)); err == nil {
		t.Error("a local address without a port parsed")
	}
	if _, err := udpBound([]byte(header+"  1: 01007F:0045 00000000:0000 07\n"), anyAddr(67)); err == nil {
		t.Error("a 6-digit address parsed")
	}
}

func TestParseUDPAddr(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    netip.AddrPort
		wantErr bool
	}{
		{"192.0.2.1:67", netip.MustParseAddrPort("192.0.2.1:67"), false},
		{":69", netip.AddrPortFrom(netip.Addr{}, 69), false},
		{"[2001:db8::1]:547", netip.MustParseAddrPort("[2001:db8::1]:547"), false},
		{"[::ffff:192.0.2.1]:67", netip.MustParseAddrPort("192.0.2.1:67"), false},
		{"localhost:67", netip.AddrPort{}, true},
		{"192.0.2.1", netip.AddrPort{}, true},
		{"192.0.2.1:70000", netip.AddrPort{}, true},
	} {
		got, err := parseUDPAddr(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseUDPAddr(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

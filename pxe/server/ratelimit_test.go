package server

import (
	"net/netip"
	"testing"
	"time"
)

// TestSourceLimiter: a source gets its burst and then waits for the rate; an IPv6
// /64 is one source; other sources are not affected; sources whose buckets refilled
// are forgotten, so the table stays bounded.
func TestSourceLimiter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newSourceLimiter(1, 3)
	l.now = func() time.Time { return now }
	a := netip.MustParseAddr("192.0.2.10")
	for i := range 3 {
		if !l.allow(a) {
			t.Fatalf("call %d of the burst refused", i+1)
		}
	}
	if l.allow(a) {
		t.Fatal("4th call within the same instant allowed (burst 3)")
	}
	if !l.allow(netip.MustParseAddr("192.0.2.11")) {
		t.Fatal("another source refused")
	}
	now = now.Add(time.Second)
	if !l.allow(a) {
		t.Fatal("a call a second later refused (rate 1/s)")
	}
	v6 := []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2:3"), netip.MustParseAddr("2001:db8::ffff:1"), netip.MustParseAddr("2001:db8::9")}
	for i, addr := range v6 {
		if got := l.allow(addr); got != (i < 3) {
			t.Fatalf("IPv6 %s (call %d from one /64): allowed=%v", addr, i+1, got)
		}
	}
	if !l.allow(netip.MustParseAddr("2001:db8:0:1::1")) {
		t.Fatal("another /64 refused")
	}

	// Fill the table, let every bucket refill, and check that new sources still get in.
	l = newSourceLimiter(1, 3)
	l.now = func() time.Time { return now }
	for i := range maxSources {
		l.allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	if l.allow(netip.MustParseAddr("198.51.100.1")) {
		t.Fatal("a new source was let in while the table was full of fresh buckets")
	}
	now = now.Add(10 * time.Second)
	if !l.allow(netip.MustParseAddr("198.51.100.1")) {
		t.Fatal("a new source refused after every bucket refilled")
	}
	if n := l.sources(); n != 1 {
		t.Fatalf("%d sources tracked after the sweep, want 1", n)
	}
}

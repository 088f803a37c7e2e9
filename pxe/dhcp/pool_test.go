package dhcp

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"
)

// refPool is the plain reading of the Leases contract that Pool must
// match: scan every lease for the client's own, then scan the range from
// its start for the lowest free address. Of several addresses leased to
// one client, the most recently set one is its current lease.
type refPool struct {
	start, end netip.Addr
	reserved   map[string]netip.Addr
	taken      map[netip.Addr]bool
	leaseTime  time.Duration
	now        func() time.Time
	leases     map[netip.Addr]refLease
	seq        int
}

type refLease struct {
	mac     string
	expires time.Time
	seq     int
}

func (p *refPool) free(a netip.Addr, mac string, now time.Time) bool {
	if a.Less(p.start) || p.end.Less(a) || p.taken[a] {
		return false
	}
	l, ok := p.leases[a]
	return !ok || l.mac == mac || !now.Before(l.expires)
}

func (p *refPool) set(a netip.Addr, mac string, expires time.Time) {
	p.seq++
	p.leases[a] = refLease{mac, expires, p.seq}
}

func (p *refPool) Offer(mac net.HardwareAddr, requested netip.Addr) (netip.Addr, bool) {
	key := mac.String()
	if a, ok := p.reserved[key]; ok {
		return a, true
	}
	now := p.now()
	var cur netip.Addr
	best := -1
	for a, l := range p.leases {
		if l.mac == key && now.Before(l.expires) && l.seq > best {
			cur, best = a, l.seq
		}
	}
	if best >= 0 {
		return cur, true
	}
	if requested.IsValid() && p.free(requested, key, now) {
		p.set(requested, key, now.Add(OfferHold))
		return requested, true
	}
	for a := p.start; a.IsValid() && !p.end.Less(a); a = a.Next() {
		if p.free(a, key, now) {
			p.set(a, key, now.Add(OfferHold))
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (p *refPool) Commit(mac net.HardwareAddr, a netip.Addr) bool {
	key := mac.String()
	if r, ok := p.reserved[key]; ok {
		return r == a
	}
	if !p.free(a, key, p.now()) {
		return false
	}
	p.set(a, key, p.now().Add(p.leaseTime))
	return true
}

func (p *refPool) Release(mac net.HardwareAddr, a netip.Addr) {
	if l, ok := p.leases[a]; ok && l.mac == mac.String() {
		delete(p.leases, a)
	}
}

func (p *refPool) Decline(mac net.HardwareAddr, a netip.Addr) {
	if l, ok := p.leases[a]; ok && l.mac == mac.String() {
		p.set(a, declined, p.now().Add(DeclineHold))
	}
}

// TestPoolMatchesReference runs random Offer, Commit, Release and Decline
// sequences, with the clock jumping past offer holds, leases and declines,
// on a Pool and on refPool, and wants the same answer every time.
func TestPoolMatchesReference(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			start, end := netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("10.0.0.40")
			res := map[string]netip.Addr{
				"02:00:00:00:00:01": netip.MustParseAddr("10.0.0.12"), // inside the range
				"02:00:00:00:00:02": netip.MustParseAddr("10.0.1.1"),  // outside it
			}
			pool, err := NewPool(start, end, res, 10*time.Minute, now)
			if err != nil {
				t.Fatal(err)
			}
			ref := &refPool{start: start, end: end, reserved: res, leaseTime: 10 * time.Minute, now: now,
				taken:  map[netip.Addr]bool{res["02:00:00:00:00:01"]: true, res["02:00:00:00:00:02"]: true},
				leases: map[netip.Addr]refLease{}}
			mac := func() net.HardwareAddr { return net.HardwareAddr{2, 0, 0, 0, 0, byte(rng.IntN(45))} }
			addr := func() netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(5 + rng.IntN(40))}) }
			for step := range 3000 {
				m := mac()
				switch op := rng.IntN(10); {
				case op < 4:
					var want netip.Addr
					if rng.IntN(3) == 0 {
						want = addr()
					}
					a, ok := pool.Offer(m, want)
					ra, rok := ref.Offer(m, want)
					if a != ra || ok != rok {
						t.Fatalf("step %d: Offer(%v, %v) = %v %v; reference %v %v", step, m, want, a, ok, ra, rok)
					}
				case op < 7:
					a := addr()
					if ok, rok := pool.Commit(m, a), ref.Commit(m, a); ok != rok {
						t.Fatalf("step %d: Commit(%v, %v) = %v; reference %v", step, m, a, ok, rok)
					}
				case op < 8:
					a := addr()
					pool.Release(m, a)
					ref.Release(m, a)
				case op < 9:
					a := addr()
					pool.Decline(m, a)
					ref.Decline(m, a)
				default:
					clock = clock.Add([]time.Duration{time.Second, 20 * time.Second, 31 * time.Second, 11 * time.Minute}[rng.IntN(4)])
				}
			}
		})
	}
}

// BenchmarkPoolOfferStorm: new clients one after the other, as in a boot
// storm; the cost per Offer must not grow with the leases already held.
func BenchmarkPoolOfferStorm(b *testing.B) {
	pool, err := NewPool(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.255.254"), nil, time.Hour, nil)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if i == 60000 { // keep within the range
			b.StopTimer()
			pool, _ = NewPool(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.255.254"), nil, time.Hour, nil)
			i = 0
			b.StartTimer()
		}
		mac := net.HardwareAddr{2, 0, 0, byte(i >> 16), byte(i >> 8), byte(i)}
		if _, ok := pool.Offer(mac, netip.Addr{}); !ok {
			b.Fatal("pool exhausted")
		}
		i++
	}
}

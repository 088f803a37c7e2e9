package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Pool is the in-memory Leases of full mode: a range of addresses plus
// reservations (MAC → address). Offers are held for OfferHold so two
// clients are not offered the same address; leases last LeaseTime.
// Leases are not persisted: after a restart a client keeps its address
// when it renews (REQUEST with ciaddr is accepted if the address is free),
// and reserved machines always get theirs.
type Pool struct {
	start, end   netip.Addr
	reservations map[string]netip.Addr // lowercase MAC → address
	reserved     map[netip.Addr]string
	leaseTime    time.Duration
	now          func() time.Time

	mu     sync.Mutex
	leases map[netip.Addr]lease
}

type lease struct {
	mac     string
	expires time.Time
}

// OfferHold is how long an offered address stays set aside for the
// client it was offered to.
const OfferHold = 30 * time.Second

// NewPool returns a Pool over [start, end] (inclusive, IPv4) with the
// given reservations (MAC string → address; reserved addresses may lie
// outside the range) and lease time (0 means 1 hour). now is the clock
// (nil means time.Now).
func NewPool(start, end netip.Addr, reservations map[string]netip.Addr, leaseTime time.Duration, now func() time.Time) (*Pool, error) {
	if !start.Is4() || !end.Is4() || end.Less(start) {
		return nil, fmt.Errorf("dhcp pool %v-%v: want two IPv4 addresses, the first not after the second", start, end)
	}
	if leaseTime <= 0 {
		leaseTime = time.Hour
	}
	if now == nil {
		now = time.Now
	}
	p := &Pool{start: start, end: end, leaseTime: leaseTime, now: now,
		reservations: map[string]netip.Addr{}, reserved: map[netip.Addr]string{}, leases: map[netip.Addr]lease{}}
	for macStr, addr := range reservations {
		mac, err := net.ParseMAC(macStr)
		if err != nil || len(mac) != 6 {
			return nil, fmt.Errorf("dhcp reservation %q: not a MAC address", macStr)
		}
		if !addr.Is4() {
			return nil, fmt.Errorf("dhcp reservation %s: %v is not an IPv4 address", macStr, addr)
		}
		if other, dup := p.reserved[addr]; dup {
			return nil, fmt.Errorf("dhcp reservation %s: %v is already reserved for %s", macStr, addr, other)
		}
		p.reservations[mac.String()] = addr
		p.reserved[addr] = mac.String()
	}
	return p, nil
}

// Offer implements Leases.
func (p *Pool) Offer(mac net.HardwareAddr, requested netip.Addr) (netip.Addr, bool) {
	key := mac.String()
	if addr, ok := p.reservations[key]; ok {
		return addr, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for addr, l := range p.leases {
		if l.mac == key && now.Before(l.expires) {
			return addr, true
		}
	}
	hold := lease{mac: key, expires: now.Add(OfferHold)}
	if requested.IsValid() && p.free(requested, key, now) {
		p.leases[requested] = hold
		return requested, true
	}
	for a := p.start; a.IsValid() && !p.end.Less(a); a = a.Next() {
		if p.free(a, key, now) {
			p.leases[a] = hold
			return a, true
		}
	}
	return netip.Addr{}, false
}

// Commit implements Leases.
func (p *Pool) Commit(mac net.HardwareAddr, addr netip.Addr) bool {
	key := mac.String()
	if r, ok := p.reservations[key]; ok {
		return r == addr
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if !p.free(addr, key, now) {
		return false
	}
	p.leases[addr] = lease{mac: key, expires: now.Add(p.leaseTime)}
	return true
}

// Release implements Leases.
func (p *Pool) Release(mac net.HardwareAddr, addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.leases[addr]; ok && l.mac == mac.String() {
		delete(p.leases, addr)
	}
}

// DeclineHold is how long an address a client declined stays out of use.
const DeclineHold = 10 * time.Minute

// declined marks a lease held for nobody.
const declined = "declined"

// Decline implements Leases: the address is set aside for DeclineHold,
// whoever held it.
func (p *Pool) Decline(mac net.HardwareAddr, addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.leases[addr]; ok && l.mac == mac.String() {
		p.leases[addr] = lease{mac: declined, expires: p.now().Add(DeclineHold)}
	}
}

// free reports whether addr is in the range, not reserved, and unleased or
// leased to mac.
func (p *Pool) free(addr netip.Addr, mac string, now time.Time) bool {
	if addr.Less(p.start) || p.end.Less(addr) {
		return false
	}
	if _, ok := p.reserved[addr]; ok {
		return false
	}
	l, ok := p.leases[addr]
	return !ok || l.mac == mac || !now.Before(l.expires)
}

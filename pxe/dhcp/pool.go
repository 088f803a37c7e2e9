package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Pool is the in-memory Leases of full mode: a range of addresses plus
// reservations (MAC → address). Offers are held for OfferHold so two
// clients are not offered the same address; leases last LeaseTime.
// Leases are not persisted: after a restart a client keeps its address
// when it renews (REQUEST with ciaddr is accepted if the address is free),
// and reserved machines always get theirs.
//
// Offer costs O(1) amortised while nothing expires, however many leases
// the pool holds (a boot storm of thousands of new clients): a client's
// leases are found through byMAC, and the search for the lowest free
// address starts at low, below which every address is taken.
type Pool struct {
	start, end   netip.Addr
	reservations map[string]netip.Addr // lowercase MAC → address
	reserved     map[netip.Addr]string
	leaseTime    time.Duration
	now          func() time.Time

	mu     sync.Mutex
	leases map[netip.Addr]lease
	// byMAC lists the addresses set aside for each MAC, oldest first;
	// entries whose lease has since gone to another MAC or expired are
	// dropped when the list is next read.
	byMAC map[string][]netip.Addr
	// low is where the search for a free pool address starts: every
	// address in [start, low) is reserved, or leased to someone until
	// lowUntil or later. Once lowUntil passes, the search starts over at
	// start.
	low      netip.Addr
	lowUntil time.Time
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
	p := &Pool{start: start, end: end, leaseTime: leaseTime, now: now, low: start, lowUntil: maxTime,
		reservations: map[string]netip.Addr{}, reserved: map[netip.Addr]string{}, leases: map[netip.Addr]lease{},
		byMAC: map[string][]netip.Addr{}}
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
	if addr, ok := p.current(key, now); ok {
		return addr, true
	}
	hold := lease{mac: key, expires: now.Add(OfferHold)}
	if requested.IsValid() && p.free(requested, key, now) {
		p.set(requested, hold)
		return requested, true
	}
	if !now.Before(p.lowUntil) {
		// A lease below low may have expired: search from the start.
		p.low, p.lowUntil = p.start, maxTime
	}
	for a := p.low; a.IsValid() && !p.end.Less(a); a = a.Next() {
		p.low = a.Next()
		if p.free(a, key, now) {
			p.set(a, hold) // a is below low now: lowUntil ≤ hold.expires
			return a, true
		}
		if l, ok := p.leases[a]; ok { // else reserved, for good
			p.lowerLowUntil(l.expires)
		}
	}
	return netip.Addr{}, false
}

// maxTime is later than any lease expiry.
var maxTime = time.Unix(1<<62, 0)

// lowerLowUntil keeps lowUntil at or before t.
func (p *Pool) lowerLowUntil(t time.Time) {
	if t.Before(p.lowUntil) {
		p.lowUntil = t
	}
}

// current returns the most recently set aside address that is still
// leased (or offered) to mac, dropping stale entries of its list.
func (p *Pool) current(mac string, now time.Time) (netip.Addr, bool) {
	list := p.byMAC[mac]
	live := list[:0]
	for _, a := range list {
		if l, ok := p.leases[a]; ok && l.mac == mac && now.Before(l.expires) {
			live = append(live, a)
		}
	}
	if len(live) == 0 {
		delete(p.byMAC, mac)
		return netip.Addr{}, false
	}
	p.byMAC[mac] = live
	return live[len(live)-1], true
}

// set records l on addr and keeps byMAC and low's bound true.
func (p *Pool) set(addr netip.Addr, l lease) {
	p.leases[addr] = l
	if l.mac != declined {
		list := p.byMAC[l.mac]
		if i := slices.Index(list, addr); i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		p.byMAC[l.mac] = append(list, addr)
	}
	if p.below(addr) {
		p.lowerLowUntil(l.expires)
	}
}

// below reports whether addr lies in [start, low); low is invalid once
// the search has passed the end of the range.
func (p *Pool) below(addr netip.Addr) bool {
	return !addr.Less(p.start) && (!p.low.IsValid() || addr.Less(p.low))
}

// remove frees addr.
func (p *Pool) remove(addr netip.Addr) {
	delete(p.leases, addr)
	if p.below(addr) {
		p.low = addr
	}
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
	p.set(addr, lease{mac: key, expires: now.Add(p.leaseTime)})
	return true
}

// Release implements Leases.
func (p *Pool) Release(mac net.HardwareAddr, addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.leases[addr]; ok && l.mac == mac.String() {
		p.remove(addr)
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
		p.set(addr, lease{mac: declined, expires: p.now().Add(DeclineHold)})
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

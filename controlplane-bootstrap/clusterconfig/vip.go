package clusterconfig

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"time"
)

// VIP is the control plane's floating API address (apiServer.vip): init runs the vip
// component, `controlplane-bootstrap vip` (package vip), which holds Address on
// Interface on one control-plane host at a time through an etcd election and
// announces it with gratuitous ARP (docs/controlplane.md). Empty Address: no VIP (the
// default).
type VIP struct {
	// Address is the floating IPv4 address with its subnet's prefix length
	// (10.0.0.10/24): a free address that no host has as its own. It is in the API
	// server's serving certificate, and apiServer.endpoint defaults to it.
	Address string `yaml:"address"`
	// Interface is the link that holds it on this host (eth0).
	Interface string `yaml:"interface"`
	// TTL is the etcd session's TTL: how long a holder that is lost without stopping
	// (power, network) keeps the address before another host takes it over. Whole
	// seconds, at least 1s; default 5s. A clean stop hands it over at once.
	TTL time.Duration `yaml:"ttl"`
	// HealthPort serves /healthz and /leader (the holder's name) on 127.0.0.1;
	// default 9446.
	HealthPort int `yaml:"healthPort"`
}

// DefaultVIPTTL is apiServer.vip.ttl when unset; it equals vip.DefaultTTL.
const DefaultVIPTTL = 5 * time.Second

// maxInterfaceName is the longest Linux interface name (IFNAMSIZ - 1).
const maxInterfaceName = 15

// Enabled reports whether a floating address is configured.
func (v *VIP) Enabled() bool { return v.Address != "" }

// IP returns the floating address without its prefix length, and whether Address is
// a valid IPv4 prefix.
func (v *VIP) IP() (netip.Addr, bool) {
	p, err := netip.ParsePrefix(v.Address)
	if err != nil || !p.Addr().Is4() {
		return netip.Addr{}, false
	}
	return p.Addr(), true
}

func (v *VIP) applyDefaults() {
	if v.TTL == 0 {
		v.TTL = DefaultVIPTTL
	}
	if v.HealthPort == 0 {
		v.HealthPort = 9446
	}
}

// validate checks the floating address when one is set (its health port is
// validatePorts'); bindAddress is where the API server listens, which must take it.
func (v *VIP) validate(p *problems, advertiseAddress, bindAddress string) {
	if !v.Enabled() {
		if v.Interface != "" {
			p.add("apiServer.vip.address", "is required when apiServer.vip.interface is set: give the floating address with its prefix length, such as 10.0.0.10/24, or leave apiServer.vip out")
		}
		return
	}
	v.validateAddress(p, advertiseAddress)
	switch {
	case v.Interface == "":
		p.add("apiServer.vip.interface", "is required with apiServer.vip.address: name the link that holds the address on this host, such as eth0")
	case len(v.Interface) > maxInterfaceName:
		p.add("apiServer.vip.interface", "%q is longer than %d bytes, so no Linux interface has that name (`ip link` lists this host's links)", v.Interface, maxInterfaceName)
	case v.Interface == "." || v.Interface == ".." || strings.ContainsAny(v.Interface, "/: \t\n"):
		p.add("apiServer.vip.interface", "%q is not a Linux interface name (`ip link` lists this host's links)", v.Interface)
	}
	switch {
	case v.TTL < time.Second:
		p.add("apiServer.vip.ttl", "%v is less than 1s: etcd leases last whole seconds, at least one; write for example 5s (the default)", v.TTL)
	case v.TTL%time.Second != 0:
		p.add("apiServer.vip.ttl", "%v is not whole seconds, which etcd leases count in; write for example 5s", v.TTL)
	}
	if b, err := netip.ParseAddr(bindAddress); err == nil && !b.IsUnspecified() {
		p.add("apiServer.bindAddress", "%q does not take apiServer.vip.address: write 0.0.0.0, so that kube-apiserver answers on the floating address on whichever host holds it", bindAddress)
	}
}

// validateAddress checks that Address is an IPv4 host address with a prefix length,
// not this host's own.
func (v *VIP) validateAddress(p *problems, advertiseAddress string) {
	const field = "apiServer.vip.address"
	a, err := netip.ParsePrefix(v.Address)
	if err != nil {
		p.add(field, "%q is not an IPv4 address with its prefix length: write the floating address and its subnet's length, such as 10.0.0.10/24", v.Address)
		return
	}
	ip := a.Addr()
	broadcast := ip
	if ip.Is4() && a.Bits() < 31 {
		n := a.Masked().Addr().As4()
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(n[:])|(1<<(32-a.Bits())-1))
		broadcast = netip.AddrFrom4(b)
	}
	switch {
	case !ip.Is4():
		p.add(field, "%q: IPv6 is not supported yet (holding an IPv6 address needs NDP announcements, not ARP); give an IPv4 address such as 10.0.0.10/24", v.Address)
	case ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		p.add(field, "%q is not a unicast address that hosts reach; give a free address of this host's subnet, such as 10.0.0.10/24", v.Address)
	case a.Bits() < 31 && ip == a.Masked().Addr():
		p.add(field, "%q is the network address of its prefix; give a host address inside it, such as %s", v.Address, netip.PrefixFrom(ip.Next(), a.Bits()))
	case a.Bits() < 31 && ip == broadcast:
		p.add(field, "%q is the broadcast address of its prefix; give a host address inside it", v.Address)
	case ip.String() == advertiseAddress:
		p.add(field, "%q is apiServer.advertiseAddress, this host's own address: give a free address of the same subnet that no host has", v.Address)
	}
}

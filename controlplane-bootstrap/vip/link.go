package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// addAddress adds the address to the interface. It is not an error if the interface
// has it already.
func (h *holder) addAddress() error {
	link, err := netlink.LinkByName(h.cfg.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", h.cfg.Interface, err)
	}
	a := h.cfg.Address
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", a, h.cfg.Interface, err)
	}
	return nil
}

// deleteAddress deletes the address from the interface, with whatever prefix length
// it has there, and returns what it deleted. It is not an error if the interface
// does not have it.
func (h *holder) deleteAddress() ([]netip.Prefix, error) {
	link, err := netlink.LinkByName(h.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", h.cfg.Interface, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list the addresses of %s: %w", h.cfg.Interface, err)
	}
	var deleted []netip.Prefix
	for _, addr := range addrs {
		ip, ok := netip.AddrFromSlice(addr.IP)
		if !ok || ip.Unmap() != h.cfg.Address.Addr() {
			continue
		}
		if err := netlink.AddrDel(link, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return deleted, fmt.Errorf("delete %s from %s: %w", addr.IPNet, h.cfg.Interface, err)
		}
		ones, _ := addr.Mask.Size()
		deleted = append(deleted, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return deleted, nil
}

// removeStale deletes the address from the interface if it is there before this
// host has campaigned: an earlier run that was killed (SIGKILL, a crash) left it, and
// another host may hold it now.
func (h *holder) removeStale() error {
	deleted, err := h.deleteAddress()
	if err != nil {
		return fmt.Errorf("remove a leftover API address: %w", err)
	}
	if len(deleted) > 0 {
		h.log.Warn("deleted the API address left on the interface by an earlier run", "deleted", deleted)
	}
	return nil
}

// announce sends one gratuitous ARP request for the address from the interface to
// the broadcast address, so that neighbours update their ARP caches to this host.
func (h *holder) announce() error {
	ifi, err := net.InterfaceByName(h.cfg.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", h.cfg.Interface, err)
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("open an ARP socket on %s: %w", h.cfg.Interface, err)
	}
	defer c.Close()
	ip := h.cfg.Address.Addr()
	p, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
	if err != nil {
		return fmt.Errorf("build the gratuitous ARP for %s on %s: %w", ip, h.cfg.Interface, err)
	}
	if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
		return fmt.Errorf("send the gratuitous ARP for %s on %s: %w", ip, h.cfg.Interface, err)
	}
	return nil
}

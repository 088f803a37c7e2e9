package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/dhcp"
	"github.com/gpurack/gpurack/pxe/identity"
)

// startDHCP serves DHCP on ports 67 and 4011 of each configured interface.
func (g *gpuboot) startDHCP(ctx context.Context) (started, error) {
	cfg := g.cfg
	if !cfg.DHCPEnabled() {
		return started{}, nil
	}
	metrics := dhcp.NewMetrics(g.metrics)
	var loops []loop
	for _, in := range cfg.Interfaces {
		dc, err := dhcpConfig(cfg, in.Name, g.boot.ScriptURL(), g.ipxeDir != "")
		if err != nil {
			return started{}, err
		}
		for _, port := range []int{67, 4011} {
			conn, err := dhcp.Listen(in.Name, port)
			if err != nil {
				return started{}, err
			}
			s := &dhcp.Server{Config: dc, Metrics: metrics, Log: g.log}
			loops = append(loops, loop{name: fmt.Sprintf("dhcp %s:%d", in.Name, port), run: func() error { return s.Serve(ctx, conn) }})
		}
	}
	return started{loops: loops}, nil
}

// dhcpConfig is the DHCP server configuration for one interface.
func dhcpConfig(cfg *config.Config, iface, scriptURL string, haveIPXE bool) (dhcp.Config, error) {
	serverIP, err := interfaceIPv4(cfg.Advertise, iface)
	if err != nil {
		return dhcp.Config{}, err
	}
	dc := dhcp.Config{
		Mode: dhcp.Mode(cfg.DHCP.Mode), ServerIP: serverIP, ScriptURL: scriptURL,
		BIOSBootFile: cfg.DHCP.BIOSBootFile, EFIBootFile: cfg.DHCP.EFIBootFile,
	}
	if haveIPXE {
		_, httpPort, _ := net.SplitHostPort(cfg.Listen.HTTP)
		dc.HTTPBootURL = "http://" + net.JoinHostPort(cfg.Advertise, httpPort) + "/ipxe/ipxe.efi"
	}
	if dc.Mode == dhcp.ModeFull {
		if err := fullDHCP(&dc, cfg.DHCP); err != nil {
			return dhcp.Config{}, err
		}
	}
	if err := dc.Validate(); err != nil {
		return dhcp.Config{}, fmt.Errorf("dhcp on %s: %w", iface, err)
	}
	return dc, nil
}

// fullDHCP adds full mode's address pool, reservations and options to dc.
func fullDHCP(dc *dhcp.Config, d config.DHCP) error {
	p := d.Pool
	res := map[string]netip.Addr{}
	for _, r := range d.Reservations {
		mac, err := identity.NormalizeMAC(r.MAC)
		if err != nil {
			return fmt.Errorf("dhcp.reservations: %w", err)
		}
		res[mac.String()] = netip.MustParseAddr(r.IP)
	}
	pool, err := dhcp.NewPool(netip.MustParseAddr(p.Start), netip.MustParseAddr(p.End), res, p.LeaseTime, time.Now)
	if err != nil {
		return fmt.Errorf("dhcp.pool: %w", err)
	}
	dc.Leases = pool
	dc.SubnetMask = net.IPMask(netip.MustParseAddr(p.Netmask).AsSlice())
	for _, r := range p.Routers {
		if a, err := netip.ParseAddr(r); err == nil {
			dc.Routers = append(dc.Routers, a)
		}
	}
	for _, r := range p.DNS {
		if a, err := netip.ParseAddr(r); err == nil {
			dc.DNS = append(dc.DNS, a)
		}
	}
	dc.LeaseTime = p.LeaseTime
	return nil
}

// interfaceIPv4 returns advertise if it is an IPv4 address, else the first IPv4 address
// of the interface.
func interfaceIPv4(advertise, iface string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(advertise); err == nil && a.Is4() {
		return a, nil
	}
	in, err := net.InterfaceByName(iface)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: %w", iface, err)
	}
	addrs, err := in.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, errors.New("interface " + iface + " has no IPv4 address: set advertise to gpuboot's IPv4 address")
}

package dhcp

import (
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// BenchmarkHandleProxyDiscover: parse a UEFI PXE DHCPDISCOVER, decide,
// serialise the OFFER (what the socket loop does per packet).
func BenchmarkHandleProxyDiscover(b *testing.B) {
	pkt := request(b, dhcpv4.MessageTypeDiscover, pxe(7)...).ToBytes()
	s := &Server{Config: proxyConfig()}
	src := netip.MustParseAddrPort("0.0.0.0:68")
	b.ReportAllocs()
	for b.Loop() {
		reply, _, _ := s.Handle(pkt, src, 67)
		_ = reply.ToBytes()
	}
}

package dhcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

var (
	serverIP = netip.MustParseAddr("10.88.0.1")
	clientHW = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	guid     = []byte{0, 0x44, 0x33, 0x22, 0x11, 0x66, 0x55, 0x88, 0x77, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00}
)

func proxyConfig() Config {
	return Config{
		ServerIP:    serverIP,
		ScriptURL:   "http://10.88.0.1:8080/boot.ipxe",
		HTTPBootURL: "http://10.88.0.1:8080/ipxe/ipxe.efi",
	}
}

func request(t testing.TB, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	req, err := dhcpv4.New(append([]dhcpv4.Modifier{
		dhcpv4.WithHwAddr(clientHW),
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithBroadcast(true),
	}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func pxe(arch iana.Arch) []dhcpv4.Modifier {
	vendor := map[iana.Arch]string{0: "PXEClient:Arch:00000:UNDI:002001", 7: "PXEClient:Arch:00007:UNDI:003000",
		9: "PXEClient:Arch:00009:UNDI:003000", 16: "HTTPClient:Arch:00016:UNDI:003000", 11: "PXEClient:Arch:00011:UNDI:003000"}[arch]
	return []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(vendor)),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guid),
	}
}

func TestProxyOfferByArch(t *testing.T) {
	for _, tc := range []struct {
		arch   iana.Arch
		file   string
		vendor string
	}{
		{0, "undionly.kpxe", "PXEClient"},
		{7, "snponly.efi", "PXEClient"},
		{9, "snponly.efi", "PXEClient"},
		{16, "http://10.88.0.1:8080/ipxe/ipxe.efi", "HTTPClient"},
	} {
		req := request(t, dhcpv4.MessageTypeDiscover, pxe(tc.arch)...)
		reply, reason := Decide(req, proxyConfig())
		if reply == nil {
			t.Fatalf("arch %d: ignored: %s", tc.arch, reason)
		}
		if reply.MessageType() != dhcpv4.MessageTypeOffer {
			t.Errorf("arch %d: %v, want OFFER", tc.arch, reply.MessageType())
		}
		if !reply.YourIPAddr.IsUnspecified() {
			t.Errorf("arch %d: proxy offer gives yiaddr %v", tc.arch, reply.YourIPAddr)
		}
		if got := reply.BootFileNameOption(); got != tc.file || reply.BootFileName != tc.file {
			t.Errorf("arch %d: option 67 %q, file %q; want %q", tc.arch, got, reply.BootFileName, tc.file)
		}
		if got := reply.ClassIdentifier(); got != tc.vendor {
			t.Errorf("arch %d: option 60 %q; want %q", tc.arch, got, tc.vendor)
		}
		if !reply.ServerIdentifier().Equal(net.IP(serverIP.AsSlice())) || !reply.ServerIPAddr.Equal(net.IP(serverIP.AsSlice())) {
			t.Errorf("arch %d: option 54 %v siaddr %v", tc.arch, reply.ServerIdentifier(), reply.ServerIPAddr)
		}
		if reply.TFTPServerName() != "10.88.0.1" || reply.ServerHostName != "10.88.0.1" {
			t.Errorf("arch %d: option 66 %q sname %q", tc.arch, reply.TFTPServerName(), reply.ServerHostName)
		}
		if got := reply.Options.Get(dhcpv4.OptionClientMachineIdentifier); !bytes.Equal(got, guid) {
			t.Errorf("arch %d: option 97 not echoed: % x", tc.arch, got)
		}
		vso := reply.Options.Get(dhcpv4.OptionVendorSpecificInformation)
		switch {
		case tc.arch == 0 && !bytes.Equal(vso, []byte{6, 1, 8, 255}):
			t.Errorf("arch %d: option 43 % x; want 06 01 08 ff", tc.arch, vso)
		case (tc.arch == 7 || tc.arch == 9) && vso != nil:
			t.Errorf("arch %d: option 43 % x in the offer; want none (BINL: ask port 4011)", tc.arch, vso)
		}
		if reply.TransactionID != req.TransactionID || !bytes.Equal(reply.ClientHWAddr, clientHW) {
			t.Errorf("arch %d: xid or chaddr not copied", tc.arch)
		}
	}
}

func TestProxyEFIBootFileConfigurable(t *testing.T) {
	cfg := proxyConfig()
	cfg.EFIBootFile = "ipxe.efi"
	reply, _ := Decide(request(t, dhcpv4.MessageTypeDiscover, pxe(7)...), cfg)
	if reply == nil || reply.BootFileNameOption() != "ipxe.efi" {
		t.Fatalf("reply %v", reply)
	}
}

func TestIPXEGetsScript(t *testing.T) {
	for name, mod := range map[string]dhcpv4.Modifier{
		"user class raw":      dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")),
		"user class rfc 3004": dhcpv4.WithUserClass("iPXE", true),
		"option 175":          dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{19, 1, 1}),
	} {
		req := request(t, dhcpv4.MessageTypeDiscover, append(pxe(0), mod)...)
		reply, reason := Decide(req, proxyConfig())
		if reply == nil {
			t.Fatalf("%s: ignored: %s", name, reason)
		}
		if got := reply.BootFileNameOption(); got != "http://10.88.0.1:8080/boot.ipxe" {
			t.Errorf("%s: boot file %q", name, got)
		}
		if reply.Options.Has(dhcpv4.GenericOptionCode(175)) {
			t.Errorf("%s: proxy mode must not set no-pxedhcp", name)
		}
	}
}

func TestProxyIgnores(t *testing.T) {
	other := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 88, 0, 2)))
	for _, tc := range []struct {
		name string
		req  *dhcpv4.DHCPv4
		want Reason
	}{
		{"plain client", request(t, dhcpv4.MessageTypeDiscover), ReasonNotPXE},
		{"arm64", request(t, dhcpv4.MessageTypeDiscover, pxe(11)...), ReasonUnsupportedArch},
		{"request to site server", request(t, dhcpv4.MessageTypeRequest, append(pxe(0), other)...), ReasonOtherServer},
		{"lease request to a site server sharing our address", request(t, dhcpv4.MessageTypeRequest, append(pxe(7),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(serverIP.AsSlice()))),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 88, 0, 59))))...), ReasonLeaseRequest},
		{"request without ciaddr", request(t, dhcpv4.MessageTypeRequest, pxe(7)...), ReasonProxyNoClientIP},
		{"release", request(t, dhcpv4.MessageTypeRelease, pxe(0)...), ReasonMessageType},
		{"no arch", request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient"))), ReasonUnsupportedArch},
		{"reply", func() *dhcpv4.DHCPv4 {
			r := request(t, dhcpv4.MessageTypeOffer)
			r.OpCode = dhcpv4.OpcodeBootReply
			return r
		}(), ReasonNotRequest},
	} {
		reply, reason := Decide(tc.req, proxyConfig())
		if reply != nil || reason != tc.want {
			t.Errorf("%s: reply %v reason %q; want %q", tc.name, reply, reason, tc.want)
		}
	}
}

func TestProxyRequestOn4011(t *testing.T) {
	req := request(t, dhcpv4.MessageTypeRequest, append(pxe(7), dhcpv4.WithClientIP(net.IPv4(10, 88, 0, 60)), dhcpv4.WithBroadcast(false))...)
	reply, reason := Decide(req, proxyConfig())
	if reply == nil {
		t.Fatalf("ignored: %s", reason)
	}
	if reply.MessageType() != dhcpv4.MessageTypeAck || reply.BootFileNameOption() != "snponly.efi" {
		t.Errorf("reply %v", reply.Summary())
	}
	if vso := reply.Options.Get(dhcpv4.OptionVendorSpecificInformation); !bytes.Equal(vso, []byte{6, 1, 8, 255}) {
		t.Errorf("4011 ACK option 43 % x; want 06 01 08 ff", vso)
	}
	src := netip.MustParseAddrPort("10.88.0.60:4011")
	if dst := Destination(req, reply, src, PXEPort); dst != src {
		t.Errorf("4011 reply to %v; want %v", dst, src)
	}
}

func TestDestination(t *testing.T) {
	bcast := netip.MustParseAddrPort("255.255.255.255:68")
	req := request(t, dhcpv4.MessageTypeDiscover, pxe(0)...)
	reply, _ := Decide(req, proxyConfig())
	if dst := Destination(req, reply, netip.MustParseAddrPort("0.0.0.0:68"), 67); dst != bcast {
		t.Errorf("broadcast discover → %v", dst)
	}
	relayed := request(t, dhcpv4.MessageTypeDiscover, append(pxe(0), dhcpv4.WithGatewayIP(net.IPv4(10, 1, 2, 1)))...)
	reply, _ = Decide(relayed, proxyConfig())
	if !reply.GatewayIPAddr.Equal(net.IPv4(10, 1, 2, 1)) {
		t.Errorf("giaddr not copied: %v", reply.GatewayIPAddr)
	}
	if dst := Destination(relayed, reply, netip.MustParseAddrPort("10.1.2.1:67"), 67); dst != netip.MustParseAddrPort("10.1.2.1:67") {
		t.Errorf("relayed → %v; want the relay on port 67 (RFC 2131 §4.1)", dst)
	}
	renew := request(t, dhcpv4.MessageTypeInform, append(pxe(0), dhcpv4.WithClientIP(net.IPv4(10, 88, 0, 70)), dhcpv4.WithBroadcast(false))...)
	reply, _ = Decide(renew, proxyConfig())
	if dst := Destination(renew, reply, netip.MustParseAddrPort("10.88.0.70:68"), 67); dst != netip.MustParseAddrPort("10.88.0.70:68") {
		t.Errorf("ciaddr → %v", dst)
	}
}

func fullConfig(t testing.TB) Config {
	pool, err := NewPool(netip.MustParseAddr("10.88.0.50"), netip.MustParseAddr("10.88.0.51"),
		map[string]netip.Addr{"52:54:00:00:00:99": netip.MustParseAddr("10.88.0.9")}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxyConfig()
	cfg.Mode = ModeFull
	cfg.Leases = pool
	cfg.SubnetMask = net.CIDRMask(24, 32)
	cfg.Routers = []netip.Addr{serverIP}
	return cfg
}

func TestFullMode(t *testing.T) {
	cfg := fullConfig(t)
	// iPXE client: address, script URL and no-pxedhcp.
	disc := request(t, dhcpv4.MessageTypeDiscover, append(pxe(0), dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))...)
	offer, reason := Decide(disc, cfg)
	if offer == nil {
		t.Fatalf("ignored: %s", reason)
	}
	if !offer.YourIPAddr.Equal(net.IPv4(10, 88, 0, 50)) {
		t.Errorf("yiaddr %v", offer.YourIPAddr)
	}
	if got := offer.Options.Get(dhcpv4.GenericOptionCode(175)); !bytes.Equal(got, []byte{176, 1, 1}) {
		t.Errorf("option 175 = % x; want b0 01 01 (no-pxedhcp)", got)
	}
	if offer.BootFileNameOption() != cfg.ScriptURL || offer.SubnetMask().String() != "ffffff00" {
		t.Errorf("offer %s", offer.Summary())
	}
	req := request(t, dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(serverIP.AsSlice()))))
	ack, _ := Decide(req, cfg)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("ack %v", ack)
	}
	// A non-PXE client gets an address and no boot options.
	other := request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(net.HardwareAddr{2, 0, 0, 0, 0, 1}))
	offer2, _ := Decide(other, cfg)
	if offer2 == nil || offer2.YourIPAddr.Equal(offer.YourIPAddr) || offer2.BootFileNameOption() != "" {
		t.Fatalf("second offer %v", offer2)
	}
	// The pool holds two addresses; a third client gets nothing.
	third := request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(net.HardwareAddr{2, 0, 0, 0, 0, 2}))
	if r, reason := Decide(third, cfg); r != nil || reason != ReasonPoolExhausted {
		t.Errorf("third: %v %q", r, reason)
	}
	// A reservation is offered whatever the pool holds.
	res := request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x99}))
	if r, _ := Decide(res, cfg); r == nil || !r.YourIPAddr.Equal(net.IPv4(10, 88, 0, 9)) {
		t.Errorf("reservation: %v", r)
	}
	// A declined address (in use by someone else) is not offered again.
	decl := request(t, dhcpv4.MessageTypeDecline, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)))
	if r, reason := Decide(decl, cfg); r != nil || reason != ReasonReleased {
		t.Errorf("decline: %v %q", r, reason)
	}
	if r, _ := Decide(disc, cfg); r != nil && r.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Errorf("declined address %v offered again", offer.YourIPAddr)
	}
	// A request for someone else's address is NAKed.
	steal := request(t, dhcpv4.MessageTypeRequest, dhcpv4.WithHwAddr(net.HardwareAddr{2, 0, 0, 0, 0, 3}),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)))
	if r, _ := Decide(steal, cfg); r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Errorf("steal: %v", r)
	}
}

// FuzzDecide feeds random packets to Handle (parse + Decide) in both modes
// and checks the invariants that must hold for any input.
func FuzzDecide(f *testing.F) {
	for _, arch := range []iana.Arch{0, 7, 9, 16, 11} {
		f.Add(request(f, dhcpv4.MessageTypeDiscover, pxe(arch)...).ToBytes(), false)
		f.Add(request(f, dhcpv4.MessageTypeRequest, pxe(arch)...).ToBytes(), true)
	}
	f.Add(request(f, dhcpv4.MessageTypeDiscover, append(pxe(0), dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")), dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1)))...).ToBytes(), true)
	f.Add([]byte{1, 1, 6, 0}, false)
	f.Fuzz(func(t *testing.T, pkt []byte, full bool) {
		cfg := proxyConfig()
		if full {
			cfg = fullConfig(t)
		}
		s := &Server{Config: cfg}
		reply, dst, reason := s.Handle(pkt, netip.MustParseAddrPort("10.88.0.77:68"), 67)
		if reply == nil {
			if reason == ReasonNone {
				t.Fatal("no reply and no reason")
			}
			return
		}
		if reason != ReasonNone || !dst.IsValid() {
			t.Fatalf("reply with reason %q, destination %v", reason, dst)
		}
		if !full && !reply.YourIPAddr.IsUnspecified() {
			t.Fatalf("proxy reply gives an address: %v", reply.YourIPAddr)
		}
		if reply.OpCode != dhcpv4.OpcodeBootReply {
			t.Fatal("reply is not a BOOTREPLY")
		}
		if _, err := dhcpv4.FromBytes(reply.ToBytes()); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
	})
}

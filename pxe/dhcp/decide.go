package dhcp

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// Mode selects proxyDHCP or a full DHCP server.
type Mode string

const (
	// ModeProxy answers PXE clients without giving addresses (default).
	ModeProxy Mode = "proxy"
	// ModeFull gives addresses from a pool and reservations.
	ModeFull Mode = "full"
)

// Default boot file names, as the Debian ipxe package ships them.
const (
	DefaultBIOSBootFile = "undionly.kpxe"
	DefaultEFIBootFile  = "snponly.efi"
)

// Config is what Decide needs.
type Config struct {
	// Mode is ModeProxy ("" means proxy) or ModeFull.
	Mode Mode
	// ServerIP is gpuboot's IPv4 address on the boot network: option 54,
	// siaddr and option 66 (the TFTP server). Required.
	ServerIP netip.Addr
	// ScriptURL is the absolute URL of /boot.ipxe, given to iPXE clients.
	// Required.
	ScriptURL string
	// HTTPBootURL is the URL of the EFI binary for UEFI HTTP boot (option 93
	// = 16), for example http://10.0.0.1:8080/ipxe/ipxe.efi. Empty: HTTP
	// boot clients are ignored with ReasonUnsupportedArch.
	HTTPBootURL string
	// BIOSBootFile and EFIBootFile are TFTP file names; empty means
	// DefaultBIOSBootFile and DefaultEFIBootFile.
	BIOSBootFile string
	EFIBootFile  string
	// EFIOption43InOffer puts option 43 into proxy offers to UEFI PXE
	// clients too, so they boot the offer's file without asking port 4011
	// (see binlOffer). Off by default.
	EFIOption43InOffer bool

	// Full-mode settings; ignored in proxy mode.
	Leases     Leases        // required in full mode
	SubnetMask net.IPMask    // option 1
	Routers    []netip.Addr  // option 3
	DNS        []netip.Addr  // option 6
	LeaseTime  time.Duration // option 51; 0 means 1 hour
}

// Leases is the address table of full mode. Decide calls it; the
// implementation must be safe for concurrent use. See Pool.
type Leases interface {
	// Offer returns the address to offer mac: its reservation, its
	// current lease, the requested address if free, or a free pool
	// address. false when none is available.
	Offer(mac net.HardwareAddr, requested netip.Addr) (netip.Addr, bool)
	// Commit leases addr to mac and reports whether addr was mac's to take.
	Commit(mac net.HardwareAddr, addr netip.Addr) bool
	// Release ends mac's lease on addr (DHCPRELEASE).
	Release(mac net.HardwareAddr, addr netip.Addr)
	// Decline records that addr is in use by someone else (DHCPDECLINE,
	// RFC 2131 §4.3.3): it must not be offered for a while.
	Decline(mac net.HardwareAddr, addr netip.Addr)
}

// Reason says why a request got no reply. The empty Reason means a reply.
type Reason string

// Ignore reasons; each is a label value of the ignores metric.
const (
	ReasonNone            Reason = ""
	ReasonMalformed       Reason = "malformed"               // not a parseable BOOTP/DHCP packet
	ReasonNotRequest      Reason = "not-bootrequest"         // op is BOOTREPLY
	ReasonNoMessageType   Reason = "no-message-type"         // plain BOOTP, option 53 missing
	ReasonBadHardware     Reason = "bad-hardware"            // htype not Ethernet or chaddr not 6 bytes
	ReasonNotPXE          Reason = "not-pxe"                 // proxy mode: no PXEClient/HTTPClient vendor class, not iPXE
	ReasonUnsupportedArch Reason = "unsupported-arch"        // option 93 names an architecture gpuboot has no boot file for
	ReasonOtherServer     Reason = "other-server"            // DHCPREQUEST selects another server (option 54)
	ReasonMessageType     Reason = "message-type"            // a message type this mode does not answer
	ReasonPoolExhausted   Reason = "pool-exhausted"          // full mode: no address to offer
	ReasonReleased        Reason = "release-or-decline"      // full mode: DHCPRELEASE or DHCPDECLINE handled; RFC 2131 §4.3.4-5 sends no reply
	ReasonLeaseRequest    Reason = "lease-request"           // proxy mode: a REQUEST for a lease (option 50), meant for the site's DHCP server
	ReasonProxyNoClientIP Reason = "proxy-request-no-ciaddr" // proxy mode: a REQUEST without ciaddr cannot be a ProxyDHCPREQUEST
)

// Reasons lists every ignore Reason, for pre-creating metric series.
var Reasons = []Reason{ReasonMalformed, ReasonNotRequest, ReasonNoMessageType, ReasonBadHardware, ReasonNotPXE,
	ReasonUnsupportedArch, ReasonOtherServer, ReasonMessageType, ReasonPoolExhausted, ReasonReleased, ReasonLeaseRequest, ReasonProxyNoClientIP}

// PXE vendor option (43) sub-options, PXE 2.1 §2.2.3.
const (
	pxeDiscoveryControl = 6
	// Bit 3: "if a boot file name is present in the initial DHCP or
	// ProxyDHCP offer packet, download it and do not do boot server
	// discovery".
	pxeDiscoveryBootFileOnly = 8
	optEnd                   = 255
)

// iPXE's encapsulated option space (option 175) and its no-pxedhcp
// setting (176): with it set iPXE does not wait for ProxyDHCP offers.
const (
	optIPXE          = 175
	ipxeNoPXEDHCP    = 176
	vendorPXEClient  = "PXEClient"
	vendorHTTPClient = "HTTPClient"
)

// ClientKind is how a request's boot stage was classified.
type ClientKind string

const (
	KindIPXE ClientKind = "ipxe"
	KindBIOS ClientKind = "bios"
	KindEFI  ClientKind = "efi"
	KindHTTP ClientKind = "httpboot"
	KindNone ClientKind = "none"
)

// Classify returns the client's boot stage and the boot file (a TFTP name
// or a URL) it should get, or an ignore Reason. It is part of Decide,
// exported for logs and tests.
func Classify(req *dhcpv4.DHCPv4, cfg Config) (ClientKind, string, Reason) {
	vendor := req.ClassIdentifier()
	archs := req.ClientArch()
	if IsIPXE(req) {
		return KindIPXE, cfg.ScriptURL, ReasonNone
	}
	isHTTP := strings.HasPrefix(vendor, vendorHTTPClient)
	isPXE := strings.HasPrefix(vendor, vendorPXEClient)
	if !isHTTP && !isPXE {
		return KindNone, "", ReasonNotPXE
	}
	if len(archs) == 0 {
		// PXE 2.1 requires option 93; a client without it cannot be
		// given a file that runs on it.
		return KindNone, "", ReasonUnsupportedArch
	}
	switch archs[0] {
	case iana.INTEL_X86PC:
		return KindBIOS, orDefault(cfg.BIOSBootFile, DefaultBIOSBootFile), ReasonNone
	case iana.EFI_X86_64, iana.EFI_BC:
		return KindEFI, orDefault(cfg.EFIBootFile, DefaultEFIBootFile), ReasonNone
	case iana.EFI_X86_64_HTTP:
		if cfg.HTTPBootURL == "" {
			return KindNone, "", ReasonUnsupportedArch
		}
		return KindHTTP, cfg.HTTPBootURL, ReasonNone
	}
	return KindNone, "", ReasonUnsupportedArch
}

// IsIPXE reports whether req comes from iPXE: user class (option 77)
// "iPXE", in RFC 3004 form or raw as iPXE sends it, or iPXE's own option
// 175 present.
func IsIPXE(req *dhcpv4.DHCPv4) bool {
	if req.Options.Has(dhcpv4.GenericOptionCode(optIPXE)) {
		return true
	}
	uc := req.Options.Get(dhcpv4.OptionUserClassInformation)
	return bytes.Contains(uc, []byte("iPXE"))
}

// Decide returns the reply to req, or nil and the reason it is ignored.
// It does no I/O; in full mode it calls cfg.Leases.
//
// Replies are built per RFC 2131 §4.3 (server behaviour) and PXE 2.1
// §2.2: the transaction id, flags, giaddr and chaddr are copied, option 82
// (relay agent information, RFC 3046 §2.2) and 61 (client identifier,
// RFC 6842) are echoed.
func Decide(req *dhcpv4.DHCPv4, cfg Config) (*dhcpv4.DHCPv4, Reason) {
	reply, _, reason := decide(req, cfg)
	return reply, reason
}

// decide is Decide that also returns the client's boot stage as Classify found it
// (KindNone when it was not classified), so that Handle counts replies by kind
// without classifying the request a second time.
func decide(req *dhcpv4.DHCPv4, cfg Config) (*dhcpv4.DHCPv4, ClientKind, Reason) {
	if req == nil {
		return nil, KindNone, ReasonMalformed
	}
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return nil, KindNone, ReasonNotRequest
	}
	if req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return nil, KindNone, ReasonBadHardware
	}
	mt := req.MessageType()
	if mt == dhcpv4.MessageTypeNone {
		return nil, KindNone, ReasonNoMessageType
	}
	if cfg.Mode == ModeFull {
		return decideFull(req, mt, cfg)
	}
	return decideProxy(req, mt, cfg)
}

func decideProxy(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, cfg Config) (*dhcpv4.DHCPv4, ClientKind, Reason) {
	var replyType dhcpv4.MessageType
	switch mt {
	case dhcpv4.MessageTypeDiscover:
		replyType = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		// A ProxyDHCPREQUEST names us in option 54 (iPXE, port 67) or is
		// sent to port 4011 (BINL, PXE 2.1 §2.2.6), where it may carry no
		// option 54; the client's REQUEST to the site's DHCP server names
		// that server and is not ours.
		//
		// A REQUEST with option 50 (requested IP address, RFC 2131
		// §4.3.2: SELECTING or INIT-REBOOT) asks for a lease, so it is
		// for the site's DHCP server even when that server shares our
		// address (gpuboot next to dnsmasq on one host): answering it
		// with yiaddr 0 makes the client DHCPDECLINE its lease. A
		// ProxyDHCPREQUEST comes from a client that already holds an
		// address, so ciaddr is set.
		sid := req.ServerIdentifier()
		if sid != nil && !sid.Equal(net.IP(cfg.ServerIP.AsSlice())) {
			return nil, KindNone, ReasonOtherServer
		}
		// (A requested address of 0.0.0.0 is the yiaddr of our own proxy
		// offer, taken by a client that treats it as a lease offer; the
		// ACK repeats the offer.)
		if req.Options.Has(dhcpv4.OptionRequestedIPAddress) {
			if addrOf(req.RequestedIPAddress()).IsValid() {
				return nil, KindNone, ReasonLeaseRequest
			}
		} else if req.ClientIPAddr.IsUnspecified() {
			return nil, KindNone, ReasonProxyNoClientIP
		}
		replyType = dhcpv4.MessageTypeAck
	case dhcpv4.MessageTypeInform:
		// Some ROMs ask the proxy with DHCPINFORM from their leased address.
		replyType = dhcpv4.MessageTypeAck
	default:
		return nil, KindNone, ReasonMessageType
	}
	kind, file, reason := Classify(req, cfg)
	if reason != ReasonNone {
		return nil, kind, reason
	}
	reply, err := newReply(req, replyType, cfg)
	if err != nil {
		return nil, kind, ReasonMalformed
	}
	reply.YourIPAddr = net.IPv4zero // proxyDHCP never gives addresses
	addBootOptions(req, reply, kind, file, cfg)
	return reply, kind, ReasonNone
}

func decideFull(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, cfg Config) (*dhcpv4.DHCPv4, ClientKind, Reason) {
	if cfg.Leases == nil {
		return nil, KindNone, ReasonPoolExhausted
	}
	mac := req.ClientHWAddr
	kind, file, reason := Classify(req, cfg)
	boot := reason == ReasonNone
	switch mt {
	case dhcpv4.MessageTypeDiscover:
		addr, ok := cfg.Leases.Offer(mac, addrOf(req.RequestedIPAddress()))
		if !ok {
			return nil, kind, ReasonPoolExhausted
		}
		reply, err := newReply(req, dhcpv4.MessageTypeOffer, cfg)
		if err != nil {
			return nil, kind, ReasonMalformed
		}
		reply.YourIPAddr = net.IP(addr.AsSlice())
		addNetworkOptions(reply, cfg)
		if boot {
			addBootOptions(req, reply, kind, file, cfg)
		}
		return reply, kind, ReasonNone
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(net.IP(cfg.ServerIP.AsSlice())) {
			// The client chose another server's offer (RFC 2131 §4.3.2).
			return nil, kind, ReasonOtherServer
		}
		want := addrOf(req.RequestedIPAddress())
		if !want.IsValid() {
			want = addrOf(req.ClientIPAddr) // RENEWING/REBINDING
		}
		reply, err := newReply(req, dhcpv4.MessageTypeAck, cfg)
		if err != nil {
			return nil, kind, ReasonMalformed
		}
		if !want.IsValid() || !cfg.Leases.Commit(mac, want) {
			nak, err := newReply(req, dhcpv4.MessageTypeNak, cfg)
			if err != nil {
				return nil, kind, ReasonMalformed
			}
			return nak, kind, ReasonNone
		}
		reply.YourIPAddr = net.IP(want.AsSlice())
		addNetworkOptions(reply, cfg)
		if boot {
			addBootOptions(req, reply, kind, file, cfg)
		}
		return reply, kind, ReasonNone
	case dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeDecline:
		if mt == dhcpv4.MessageTypeDecline {
			if addr := addrOf(req.RequestedIPAddress()); addr.IsValid() {
				cfg.Leases.Decline(mac, addr)
			}
		} else if addr := addrOf(req.ClientIPAddr); addr.IsValid() {
			cfg.Leases.Release(mac, addr)
		}
		return nil, kind, ReasonReleased
	case dhcpv4.MessageTypeInform:
		reply, err := newReply(req, dhcpv4.MessageTypeAck, cfg)
		if err != nil {
			return nil, kind, ReasonMalformed
		}
		reply.YourIPAddr = net.IPv4zero // RFC 2131 §4.3.5
		addNetworkOptions(reply, cfg)
		reply.Options.Del(dhcpv4.OptionIPAddressLeaseTime)
		if boot {
			addBootOptions(req, reply, kind, file, cfg)
		}
		return reply, kind, ReasonNone
	}
	return nil, kind, ReasonMessageType
}

func newReply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType, cfg Config) (*dhcpv4.DHCPv4, error) {
	return dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithServerIP(net.IP(cfg.ServerIP.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(cfg.ServerIP.AsSlice()))),
	)
}

func addNetworkOptions(reply *dhcpv4.DHCPv4, cfg Config) {
	lease := cfg.LeaseTime
	if lease <= 0 {
		lease = time.Hour
	}
	reply.UpdateOption(dhcpv4.OptIPAddressLeaseTime(lease))
	if cfg.SubnetMask != nil {
		reply.UpdateOption(dhcpv4.OptSubnetMask(cfg.SubnetMask))
	}
	if len(cfg.Routers) > 0 {
		reply.UpdateOption(dhcpv4.OptRouter(ips(cfg.Routers)...))
	}
	if len(cfg.DNS) > 0 {
		reply.UpdateOption(dhcpv4.OptDNS(ips(cfg.DNS)...))
	}
}

// addBootOptions sets the PXE/HTTP-boot options of a reply; see the
// package comment for which options and why.
func addBootOptions(req, reply *dhcpv4.DHCPv4, kind ClientKind, file string, cfg Config) {
	server := cfg.ServerIP.String()
	if kind == KindHTTP {
		reply.UpdateOption(dhcpv4.OptClassIdentifier(vendorHTTPClient))
	} else {
		reply.UpdateOption(dhcpv4.OptClassIdentifier(vendorPXEClient))
		if !binlOffer(reply, kind, cfg) {
			reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation,
				[]byte{pxeDiscoveryControl, 1, pxeDiscoveryBootFileOnly, optEnd}))
		}
	}
	reply.ServerHostName = server
	reply.UpdateOption(dhcpv4.OptTFTPServerName(server))
	reply.UpdateOption(dhcpv4.OptBootFileName(file))
	if len(file) < 128 { // the BOOTP file field holds 127 bytes and a NUL
		reply.BootFileName = file
	}
	if guid := req.Options.Get(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
	}
	if kind == KindIPXE && cfg.Mode == ModeFull {
		reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.GenericOptionCode(optIPXE), []byte{ipxeNoPXEDHCP, 1, 1}))
	}
}

// binlOffer reports whether reply is a proxy OFFER to a UEFI PXE client
// that goes without option 43. A proxy offer with option 60 "PXEClient"
// and no PXE vendor options is a "BINL" offer (PXE 2.1 §2.2.6): the client
// sends a DHCPREQUEST to port 4011 of the proxy and boots the file named
// in the ACK. EDK2-based firmware (OVMF, most servers) handles that path
// and uses the offer's boot file directly when 43.6 is present; some
// firmware ignores proxy offers it cannot use that way. gpuboot takes the
// 4011 path for UEFI unless EFIOption43InOffer is set; see
// docs/decisions/0300-proxydhcp-binl-for-uefi.md.
func binlOffer(reply *dhcpv4.DHCPv4, kind ClientKind, cfg Config) bool {
	return kind == KindEFI && cfg.Mode != ModeFull && !cfg.EFIOption43InOffer &&
		reply.MessageType() == dhcpv4.MessageTypeOffer
}

// Destination returns where to send reply to req, which arrived from src
// on a socket bound to localPort (67 or 4011), following RFC 2131 §4.1:
//
//   - giaddr set: unicast to the relay agent on port 67;
//   - the request came to port 4011 (PXE 2.1 §2.2.6): back to its source;
//   - a DHCPNAK, or the broadcast bit set, or no usable client address:
//     broadcast to 255.255.255.255:68;
//   - ciaddr set: unicast to ciaddr:68.
//
// Unicasting to yiaddr before the client has configured it would need an
// ARP entry written by hand; like most servers, gpuboot broadcasts instead,
// which RFC 2131 §4.1 permits.
func Destination(req, reply *dhcpv4.DHCPv4, src netip.AddrPort, localPort uint16) netip.AddrPort {
	if gi := addrOf(req.GatewayIPAddr); gi.IsValid() {
		return netip.AddrPortFrom(gi, dhcpv4.ServerPort)
	}
	if localPort != dhcpv4.ServerPort && src.Addr().IsValid() && !src.Addr().IsUnspecified() {
		return src
	}
	if reply.MessageType() == dhcpv4.MessageTypeNak || req.IsBroadcast() {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), dhcpv4.ClientPort)
	}
	if ci := addrOf(req.ClientIPAddr); ci.IsValid() {
		return netip.AddrPortFrom(ci, dhcpv4.ClientPort)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), dhcpv4.ClientPort)
}

// addrOf converts a net.IP to a netip.Addr; nil, 0.0.0.0 and non-IPv4
// give the invalid Addr.
func addrOf(ip net.IP) netip.Addr {
	ip4 := ip.To4()
	if ip4 == nil {
		return netip.Addr{}
	}
	a := netip.AddrFrom4([4]byte(ip4))
	if a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

func ips(addrs []netip.Addr) []net.IP {
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.IP(a.AsSlice()))
	}
	return out
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Validate checks cfg and returns an error naming the field to fix.
func (cfg Config) Validate() error {
	if !cfg.ServerIP.Is4() {
		return fmt.Errorf("dhcp: server IP %v: want the IPv4 address gpuboot has on the boot network", cfg.ServerIP)
	}
	if cfg.ScriptURL == "" {
		return fmt.Errorf("dhcp: script URL is empty: want http://<server>:8080/boot.ipxe")
	}
	switch cfg.Mode {
	case "", ModeProxy:
	case ModeFull:
		if cfg.Leases == nil {
			return fmt.Errorf("dhcp: full mode needs an address pool")
		}
	default:
		return fmt.Errorf("dhcp: mode %q: want %q or %q", cfg.Mode, ModeProxy, ModeFull)
	}
	return nil
}

// Package dhcp is gpuboot's DHCPv4 side: it tells PXE firmware and iPXE
// where to fetch their next stage, and in full mode also hands out
// addresses. It has two halves:
//
//   - Decide, a pure function from one request to a reply or an ignore
//     Reason. It has no sockets, no clock and no logging; in full mode the
//     only state it touches is the Leases table in its Config.
//   - Server, the edge: Serve reads a datagram; Handle parses it, calls
//     the decision once, counts the outcome and logs a reply; Serve writes
//     the reply to the address Destination picks (RFC 2131 §4.1). It
//     listens on port 67 and, for proxyDHCP, on port 4011.
//
// # Modes
//
// Proxy mode (the default, PXE 2.1 §2.2.5 "proxyDHCP") coexists with the
// site's DHCP server: it never sets yiaddr, answers only PXE and HTTP-boot
// clients (vendor class "PXEClient…" or "HTTPClient…", or iPXE), answers
// DHCPDISCOVER on port 67 with an OFFER and DHCPREQUEST on port 67 or 4011
// (PXE 2.1 §2.2.6, "Boot Server Discover"/BINL) with an ACK, and ignores
// everything addressed to another server. Full mode is a small DHCP server
// with a pool and reservations; it answers every client with an address,
// and PXE clients also with boot options. It never pings an address before
// offering it (that costs the client 3 s; a conflict shows as a
// DHCPDECLINE instead).
//
// # Boot files
//
//   - iPXE (user class "iPXE", RFC 3004 option 77, or iPXE's option 175
//     present) gets the HTTP URL of its script: this breaks the
//     PXE → iPXE → PXE loop. In full mode the reply also carries iPXE's
//     encapsulated option 175.176 = 1 (no-pxedhcp), so iPXE does not wait
//     about 3 s for proxy offers.
//   - Option 93 (client system architecture, RFC 4578 §2.1; IANA
//     "Processor Architecture Types"): 0 (x86 BIOS) → Config.BIOSBootFile
//     (undionly.kpxe); 7 and 9 (x64 UEFI; both are used for x64 in the
//     wild) → Config.EFIBootFile (snponly.efi or ipxe.efi) over TFTP;
//     16 (x64 UEFI HTTP) → Config.HTTPBootURL, with vendor class
//     "HTTPClient" in the reply, which UEFI HTTP boot requires (UEFI 2.x
//     §24.7.2). Other architectures are ignored with ReasonUnsupportedArch.
//
// PXE replies carry option 60 "PXEClient", option 43 with PXE sub-option 6
// (PXE_DISCOVERY_CONTROL) = 8 ("download the boot file in this offer, no
// boot server discovery", PXE 2.1 §2.2.3 table 2-1), option 54, siaddr and
// option 66 / BOOTP sname (the TFTP server), option 67 / BOOTP file (the boot
// file; both, because some ROMs read only the header), and the client's
// option 97 (machine UUID, RFC 4578 §2.3) echoed back as PXE 2.1 requires.
// The proxy OFFER to a UEFI PXE client leaves option 43 out, which makes
// the firmware fetch the boot file name from port 4011 (BINL); see
// Config.EFIOption43InOffer and docs/decisions/0300-proxydhcp-binl-for-uefi.md.
//
// In proxy mode a DHCPREQUEST asking for a lease (option 50) is never
// answered, even when it names gpuboot's address in option 54: the site's
// DHCP server may share that address, and a proxy ACK would make the
// client decline its lease.
//
// This package does not decide whether a machine may boot or what image it
// gets: every PXE client is pointed at iPXE and then at /boot.ipxe, where
// pxe/httpboot asks the inventory. Nothing secret travels over DHCP.
package dhcp

// Package qemu holds gpuboot's end-to-end network-boot tests: a network
// namespace with a bridge and a tap device, a site DHCP server (dnsmasq,
// addresses and an IPv6 router advertisement only) beside gpuboot's
// proxyDHCP, TFTP and HTTP servers, and QEMU (TCG) booting through real
// firmware: SeaBIOS with the iPXE option ROM, and OVMF with its own UEFI
// PXE stack. The guest is Debian's kernel with an initrd the test builds,
// whose /init checks the kernel command line and reports on the serial
// console and through isa-debug-exit.
//
// TestTinyNodeJoin is the whole product on one real node: the tiny image built
// from the tree, booted from gpuboot's image store with gpuboot's kernel command
// line, enrolled (waiting for approval, `gpuboot machines approve`), and joined
// to a control plane from controlplane-bootstrap by the image's own kubelet,
// which the agent starts over D-Bus. The host side runs in a network namespace
// that owns 10.0.2.2, the address QEMU's user-mode network gives the guest for
// the host.
//
// Measured firmware facts behind the setup (RA, fresh OVMF variables,
// romfile=, isa-debug-exit) are in docs/pxe.md.
package qemu

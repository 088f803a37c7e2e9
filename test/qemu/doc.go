// Package qemu holds gpuboot's end-to-end network-boot tests: a network
// namespace with a bridge and a tap device, a site DHCP server (dnsmasq,
// addresses and an IPv6 router advertisement only) beside gpuboot's
// proxyDHCP, TFTP and HTTP servers, and QEMU (TCG) booting through real
// firmware: SeaBIOS with the iPXE option ROM, and OVMF with its own UEFI
// PXE stack. The guest is Debian's kernel with an initrd the test builds,
// whose /init checks the kernel command line and reports on the serial
// console and through isa-debug-exit.
//
// Measured firmware facts behind the setup (RA, fresh OVMF variables,
// romfile=, isa-debug-exit) are in docs/pxe.md.
package qemu

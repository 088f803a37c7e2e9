// Package qemu holds gpuboot's end-to-end network-boot tests: a network
// namespace with a bridge and a tap device, a site DHCP server (dnsmasq,
// addresses and an IPv6 router advertisement only) beside gpuboot's
// proxyDHCP, TFTP and HTTP servers, and QEMU (TCG) booting through real
// firmware: SeaBIOS with the iPXE option ROM, and OVMF with its own UEFI
// PXE stack. The guest is Debian's kernel with an initrd the test builds,
// whose /init checks the kernel command line and reports on the serial
// console and through isa-debug-exit.
//
// TestRack is the whole product on a rack of two real (QEMU) nodes, booted once:
// the tiny image and its simulated GPU variant, built from the tree (through the
// content-addressed image cache), one machine powered on through its firmware
// and PXE, enrolled (waiting for approval, `gpuboot machines approve`), and
// joined to a control plane from controlplane-bootstrap by the image's own
// kubelet; every node-level check then runs against them as a subtest. The
// rig (rig_test.go: startRack) sets up the boot network in a network namespace
// whose bridge owns 10.0.2.2, the control plane, gpuboot and the machines, from
// one call.
//
// Measured firmware facts behind the setup (RA, fresh OVMF variables,
// romfile=, isa-debug-exit) are in docs/pxe.md.
package qemu

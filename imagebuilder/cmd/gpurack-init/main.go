// Command gpurack-init is PID 1 of a gpurack image's initramfs: it fetches and verifies
// the root filesystem named on the kernel command line and switch_roots to systemd.
// It is built statically (CGO_ENABLED=0) by gpuimage; see package initramfs.
package main

import "github.com/gpurack/gpurack/imagebuilder/initramfs"

func main() { initramfs.Main() }

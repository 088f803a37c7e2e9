// Command init is PID 1 of the test initrd that test/qemu boots: it
// prints the kernel command line and a verdict to the console, then makes
// QEMU exit through isa-debug-exit (exit code 3 = ok, 5 = bad), or powers
// off if that device is absent.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// required are the docs/contracts.md §3 arguments gpuboot's script must add.
var required = []string{"initrd=initrd.img", "gpurack.rootfs=http://", "BOOTIF=01-", "gpurack.enroll=", "gpurack.enroll.ca=sha256:"}

func main() {
	out := os.Stdout
	if c, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		out = c
	}
	os.MkdirAll("/proc", 0o755)
	if err := syscall.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Fprintln(out, "GPURACK-TEST-INIT mount /proc:", err)
	}
	raw, _ := os.ReadFile("/proc/cmdline")
	cmdline := strings.TrimSpace(string(raw))
	fmt.Fprintf(out, "\nGPURACK-TEST-INIT cmdline: %s\n", cmdline)
	var missing []string
	for _, r := range required {
		if !strings.Contains(" "+cmdline, " "+r) {
			missing = append(missing, r)
		}
	}
	code := byte(1) // QEMU exit status (1<<1)|1 = 3
	if len(missing) == 0 {
		fmt.Fprintln(out, "GPURACK-BOOT-OK")
	} else {
		fmt.Fprintf(out, "GPURACK-BOOT-BAD missing %s\n", strings.Join(missing, " "))
		code = 2 // exit status 5
	}
	out.Sync()
	if port, err := os.OpenFile("/dev/port", os.O_WRONLY, 0); err == nil {
		port.WriteAt([]byte{code}, 0xf4)
	}
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

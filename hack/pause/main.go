// Command pause is the sandbox ("pause") container process that containerd starts for
// every pod. It holds the pod's namespaces open, reaps orphaned children and exits on
// SIGINT or SIGTERM. gpurack builds it locally because no image registry is reachable
// from the build machines (see hack/k8s-bins.sh).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}

// Command controlplane-bootstrap: Bring up the Kubernetes control plane that gpurack nodes join. See `controlplane-bootstrap --help`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane-bootstrap:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "controlplane-bootstrap",
		Short: "Bring up the Kubernetes control plane that gpurack nodes join",
		Long: `controlplane-bootstrap generates the cluster PKI, starts etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, and issues kubeadm-compatible join material.

Its commands arrive with the controlplane-bootstrap issue (#6); see docs/ for the design.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
}

// Command controlplane-bootstrap: Bring up the Kubernetes control plane that gpurack nodes join. See `controlplane-bootstrap --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane-bootstrap:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "controlplane-bootstrap",
		Short: "Bring up the Kubernetes control plane that gpurack nodes join",
		Long: `controlplane-bootstrap generates the cluster PKI, starts etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, and issues kubeadm-compatible join material.

See docs/controlplane.md.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newInitCommand(), newJoinCommand(), newUploadCertsCommand(), newStatusCommand(), newStopCommand(), newResetCommand(),
		newTokenCommand(), newJoinConfigCommand(), newTenantsCommand(), newUsersCommand(), newCertsCommand(), newAuditCommand(),
		newLogsCommand(), newLogsGatewayCommand(), newRegistryCommand(), newRegistryAuthCommand(), newVIPCommand(), newEtcdEnvCommand(), newNFSExportsCommand())
	return root
}

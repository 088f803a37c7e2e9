package main

import (
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

func newEtcdEnvCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "etcd-env --dir DIR",
		Short: "Print the shell exports that point etcdctl and etcdutl at this host's etcd member",
		Long: `etcd-env prints, as shell exports, what etcdctl needs to talk to this host's etcd member
(ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY: the apiserver's etcd client
certificate) and what restoring a snapshot with etcdutl needs to keep the member as the
control plane starts it (GPURACK_ETCD_NAME, GPURACK_ETCD_PEER_URL, GPURACK_ETCD_DATA_DIR).

  eval "$(controlplane-bootstrap etcd-env --dir /var/lib/gpurack/cluster)"
  etcdctl endpoint status -w table
  etcdctl snapshot save /var/backups/gpurack/etcd.db

docs/operations.md, "Backing up and restoring etcd", has the whole runbook.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, err := controlplane.Open(dir)
			if err != nil {
				return err
			}
			writeEtcdEnv(cmd.OutOrStdout(), cp.Config, cp.Layout)
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

// writeEtcdEnv writes etcd-env's exports for cfg laid out in l, each value quoted.
func writeEtcdEnv(out io.Writer, cfg *clusterconfig.Config, l components.Layout) {
	for _, kv := range [][2]string{
		{"ETCDCTL_API", "3"},
		{"ETCDCTL_ENDPOINTS", "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Etcd.ClientPort))},
		{"ETCDCTL_CACERT", l.PKI(clusterpki.EtcdCACert)},
		{"ETCDCTL_CERT", l.PKI(clusterpki.APIServerEtcdCert)},
		{"ETCDCTL_KEY", l.PKI(clusterpki.APIServerEtcdKey)},
		{"GPURACK_ETCD_NAME", cfg.NodeName},
		{"GPURACK_ETCD_PEER_URL", "https://" + net.JoinHostPort(cfg.APIServer.AdvertiseAddress, strconv.Itoa(cfg.Etcd.PeerPort))},
		{"GPURACK_ETCD_DATA_DIR", l.EtcdDataDir()},
	} {
		fmt.Fprintf(out, "export %s=%s\n", kv[0], strconv.Quote(kv[1]))
	}
}

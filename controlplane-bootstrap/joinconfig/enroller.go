package joinconfig

import (
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// EnrollerKubeconfigFile is the file `join-config --out DIR` writes.
const EnrollerKubeconfigFile = "enroller.kubeconfig"

// EnrollerKubeconfig issues a client certificate for EnrollerUser from the
// cluster CA and returns a kubeconfig for the endpoint nodes use
// (docs/contracts.md §4). Its permissions are installed by init (Objects).
func EnrollerKubeconfig(cfg *clusterconfig.Config, set *clusterpki.Set) ([]byte, error) {
	kp, err := set.IssueClient(EnrollerUser, EnrollerGroup)
	if err != nil {
		return nil, err
	}
	return clusterpki.KubeconfigBytes(cfg.ClusterName, cfg.EndpointURL(), set.CACertPEM(), EnrollerUser, kp)
}

package clusterpki

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// Kubeconfig file names in the cluster directory (kubeadm's names).
const (
	AdminKubeconfig             = "admin.conf"
	ControllerManagerKubeconfig = "controller-manager.conf"
	SchedulerKubeconfig         = "scheduler.conf"
	// KubeStateMetricsKubeconfig is kube-state-metrics' (user KubeStateMetricsUser), not
	// a kubeadm name.
	KubeStateMetricsKubeconfig = "kube-state-metrics.conf"
	// KueueKubeconfig is Kueue's (user KueueUser; cluster.yaml's queues).
	KueueKubeconfig = "kueue.conf"
)

// KubeconfigBytes renders a kubeconfig for server that trusts caPEM and
// authenticates with kp's client certificate (certificate and key embedded).
func KubeconfigBytes(clusterName, server string, caPEM []byte, user string, kp *pki.KeyPair) ([]byte, error) {
	keyPEM, err := pki.EncodeKeyPEM(kp.Key)
	if err != nil {
		return nil, err
	}
	ctx := user + "@" + clusterName
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[clusterName] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: pki.EncodeCertPEM(kp.Cert), ClientKeyData: keyPEM}
	cfg.Contexts[ctx] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: user}
	cfg.CurrentContext = ctx
	return clientcmd.Write(*cfg)
}

// EnsureKubeconfig writes path for user/groups unless a kubeconfig is there
// already that points at server, trusts this CA and carries a client
// certificate from it. It is written atomically (package atomicfile).
func (s *Set) EnsureKubeconfig(path, clusterName, server, user string, groups ...string) error {
	if s.kubeconfigCurrent(path, server, user) {
		return nil
	}
	kp, err := s.IssueClient(user, groups...)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	data, err := KubeconfigBytes(clusterName, server, s.CACertPEM(), user, kp)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return atomicfile.WriteMkdirAll(path, data, 0o600, 0o755)
}

func (s *Set) kubeconfigCurrent(path, server, user string) bool {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return false
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.Clusters[ctx.Cluster] == nil || cfg.AuthInfos[ctx.AuthInfo] == nil {
		return false
	}
	cl, ai := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cl.Server != server || string(cl.CertificateAuthorityData) != string(s.CACertPEM()) {
		return false
	}
	cert, err := pki.DecodeCertPEM(ai.ClientCertificateData)
	return err == nil && cert.Subject.CommonName == user && cert.CheckSignatureFrom(s.CA.Cert) == nil
}

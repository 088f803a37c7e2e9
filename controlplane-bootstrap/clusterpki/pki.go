// Package clusterpki creates and loads the Kubernetes cluster's certificate
// authorities, certificates, service-account key, encryption-at-rest key and
// kubeconfigs, in kubeadm's directory layout under DIR/pki.
//
// The CAs come from talos machinery's secrets package
// (config/generate/secrets), the service-account and encryption keys from the
// standard library, and the leaf certificates are issued with internal/pki (see
// docs/decisions/0100-cluster-pki-from-talos-ca-constructors.md). Ensure keeps an
// existing file and issues a missing or no longer matching leaf again from the existing
// CA; CheckExpiration reports every certificate's expiry and PlanRenewal issues named
// leaves again before they expire (docs/decisions/0682-control-plane-certificate-renewal.md).
// It never replaces a CA.
package clusterpki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/internal/pki"
)

// Paths of the PKI files, relative to the PKI directory (kubeadm's names).
const (
	CACert               = "ca.crt"
	CAKey                = "ca.key"
	FrontProxyCACert     = "front-proxy-ca.crt"
	FrontProxyCAKey      = "front-proxy-ca.key"
	EtcdCACert           = "etcd/ca.crt"
	EtcdCAKey            = "etcd/ca.key"
	SAKey                = "sa.key"
	SAPub                = "sa.pub"
	EncryptionKey        = "encryption.key"
	APIServerCert        = "apiserver.crt"
	APIServerKey         = "apiserver.key"
	APIServerKubeletCert = "apiserver-kubelet-client.crt"
	APIServerKubeletKey  = "apiserver-kubelet-client.key"
	APIServerEtcdCert    = "apiserver-etcd-client.crt"
	APIServerEtcdKey     = "apiserver-etcd-client.key"
	FrontProxyClientCert = "front-proxy-client.crt"
	FrontProxyClientKey  = "front-proxy-client.key"
	EtcdServerCert       = "etcd/server.crt"
	EtcdServerKey        = "etcd/server.key"
	EtcdPeerCert         = "etcd/peer.crt"
	EtcdPeerKey          = "etcd/peer.key"
	EtcdHealthcheckCert  = "etcd/healthcheck-client.crt"
	EtcdHealthcheckKey   = "etcd/healthcheck-client.key"
	MonitoringClientCert = "monitoring-client.crt"
	MonitoringClientKey  = "monitoring-client.key"
	// LogsGatewayCert is the log gateway's serving certificate (docs/contracts.md §15):
	// the API server's names, since nodes reach it where they reach the API server.
	LogsGatewayCert = "logs-gateway.crt"
	LogsGatewayKey  = "logs-gateway.key"
	LogsGatewayCN   = "gpurack:logs-gateway"
	// KueueServingDir holds Kueue's serving certificate for its admission webhooks and
	// its metrics (tls.crt, tls.key, the file names its certificate watcher reads): for
	// 127.0.0.1, where the API server calls it (docs/decisions/0696).
	KueueServingDir  = "kueue"
	KueueServingCert = KueueServingDir + "/tls.crt"
	KueueServingKey  = KueueServingDir + "/tls.key"
	KueueServingCN   = "gpurack:kueue-webhook"
	// RegistryCert is the image registry's serving certificate, which its token issuer
	// serves with too (docs/registry.md): the advertise address, RegistrySAN and
	// registry.certSANs.
	RegistryCert = "registry.crt"
	RegistryKey  = "registry.key"
	RegistryCN   = "gpurack-registry"
	// RegistrySAN is the DNS name every registry certificate carries, for clients that
	// map it to the control plane's address.
	RegistrySAN = "gpurack-registry"
	// Identities of the kubeconfigs and client certificates.
	ControllerManagerUser  = "system:kube-controller-manager"
	SchedulerUser          = "system:kube-scheduler"
	AdminUser              = "kubernetes-admin"
	AdminGroup             = "system:masters"
	APIServerKubeletUser   = "kube-apiserver-kubelet-client"
	APIServerKubeletGroup  = "kubeadm:cluster-admins"
	FrontProxyClientUser   = "front-proxy-client"
	APIServerEtcdClientCN  = "kube-apiserver-etcd-client"
	EtcdHealthcheckClientC = "kube-etcd-healthcheck-client"
	// MonitoringUser is the metrics server's identity: it discovers nodes and scrapes
	// the apiserver, kubelets, the scheduler and the controller-manager as this user
	// (RBAC: ClusterRole gpurack:monitoring).
	MonitoringUser = "gpurack:monitoring"
	// MonitoringSAN is the DNS name in the same certificate: node_exporter's web
	// configuration admits a client by SAN only (client_allowed_sans), and gpuagent
	// writes it there (agent/metricsauth.MonitoringSAN; decision 0693).
	MonitoringSAN = "gpurack-monitoring"
	// KubeStateMetricsUser is kube-state-metrics' identity (KubeStateMetricsKubeconfig):
	// it lists and watches the objects it reports on (RBAC: ClusterRole
	// gpurack:kube-state-metrics).
	KubeStateMetricsUser = "gpurack:kube-state-metrics"
	// KueueUser is Kueue's identity (KueueKubeconfig): its ClusterRole gpurack:kueue is
	// the manager role of Kueue's own config/components/rbac.
	KueueUser = "gpurack:kueue"
)

// leaf describes one leaf certificate and how to decide it is still right.
type leaf struct {
	cert, key string
	ca        string // CA key in Set.CAs
	req       pki.CertRequest
}

// Set is the loaded cluster PKI.
type Set struct {
	Dir string
	// CA, FrontProxyCA and EtcdCA sign the cluster's certificates.
	CA, FrontProxyCA, EtcdCA *pki.CA
	// SAKey signs service-account tokens.
	SAKey crypto.Signer
	// EncryptionKey is the 32-byte secretbox key for Secrets at rest.
	EncryptionKey []byte
	// LeafValidity is how long the leaves and client certificates it issues are valid;
	// zero means pki.DefaultLeafValidity (one year). Tests set minutes.
	LeafValidity time.Duration
}

// Ensure is EnsureValidity with leaves valid for pki.DefaultLeafValidity.
func Ensure(dir string, cfg *clusterconfig.Config) (*Set, error) { return EnsureValidity(dir, cfg, 0) }

// EnsureValidity makes dir a complete PKI for cfg and returns it. If dir does not
// exist the CAs and keys are created in a temporary directory beside it and
// moved into place in one rename, so an interrupted run leaves either nothing
// or a complete set. If dir exists its CAs are kept, and each leaf that is
// missing, unreadable or no longer covers cfg's names is issued again, valid for
// leafValidity (zero: pki.DefaultLeafValidity), as are the client certificates the
// returned Set issues.
func EnsureValidity(dir string, cfg *clusterconfig.Config, leafValidity time.Duration) (*Set, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := createRoots(dir); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("cluster PKI: %w", err)
	}
	set, err := Load(dir)
	if err != nil {
		return nil, err
	}
	set.LeafValidity = leafValidity
	for _, l := range set.leaves(cfg) {
		if err := set.ensureLeaf(l); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// fillThenRename fills a temporary directory beside dir with fill and renames it to
// dir, so that a failure or an interruption leaves nothing at dir.
func fillThenRename(dir string, fill func(tmp string) error) error {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op after the rename
	if err := fill(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("cluster PKI: move %s into place: %w", tmp, err)
	}
	return nil
}

// createRoots generates the CAs, the service-account key and the encryption
// key into a temporary directory and renames it to dir.
func createRoots(dir string) error { return fillThenRename(dir, generateRoots) }

// generateRoots writes new roots into tmp.
func generateRoots(tmp string) error {
	// The three CAs come from talos machinery's secrets package: the same
	// constructors its secrets bundle uses (ECDSA P-256, ten years). The
	// bundle itself is not used because it also makes a Talos OS CA with an
	// RSA-4096 key, which takes seconds and which gpurack has no use for.
	now := time.Now()
	k8sCA, err := secrets.NewKubernetesCA(now, talosconfig.TalosVersionCurrent)
	if err != nil {
		return fmt.Errorf("cluster PKI: cluster CA: %w", err)
	}
	aggregatorCA, err := secrets.NewAggregatorCA(now, talosconfig.TalosVersionCurrent)
	if err != nil {
		return fmt.Errorf("cluster PKI: front-proxy CA: %w", err)
	}
	etcdCA, err := secrets.NewEtcdCA(now, talosconfig.TalosVersionCurrent)
	if err != nil {
		return fmt.Errorf("cluster PKI: etcd CA: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, "etcd"), 0o700); err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	for _, ca := range []struct {
		crt, key []byte
		certPath string
		keyPath  string
	}{
		{k8sCA.CrtPEM, k8sCA.KeyPEM, CACert, CAKey},
		{aggregatorCA.CrtPEM, aggregatorCA.KeyPEM, FrontProxyCACert, FrontProxyCAKey},
		{etcdCA.CrtPEM, etcdCA.KeyPEM, EtcdCACert, EtcdCAKey},
	} {
		key, err := parseAnyKey(ca.key)
		if err != nil {
			return fmt.Errorf("cluster PKI: %s from the secrets bundle: %w", ca.keyPath, err)
		}
		keyPEM, err := pki.EncodeKeyPEM(key)
		if err != nil {
			return fmt.Errorf("cluster PKI: %w", err)
		}
		if err := writeFile(filepath.Join(tmp, ca.keyPath), keyPEM, 0o600); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(tmp, ca.certPath), ca.crt, 0o644); err != nil {
			return err
		}
	}
	// The service-account key and the encryption key are made the way the
	// secrets bundle makes them (an ECDSA P-256 key; 32 random bytes in
	// base64, the form EncryptionConfiguration takes).
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("cluster PKI: service-account key: %w", err)
	}
	saPEM, err := pki.EncodeKeyPEM(saKey)
	if err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	encKey := make([]byte, 32)
	if _, err := rand.Read(encKey); err != nil {
		return fmt.Errorf("cluster PKI: encryption key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	if err := writeFile(filepath.Join(tmp, SAKey), saPEM, 0o600); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(tmp, SAPub), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(tmp, EncryptionKey), []byte(base64.StdEncoding.EncodeToString(encKey)+"\n"), 0o600)
}

// Load reads the CAs and keys of an existing PKI directory.
func Load(dir string) (*Set, error) {
	s := &Set{Dir: dir}
	var err error
	if s.CA, err = loadCA(dir, CACert, CAKey); err != nil {
		return nil, err
	}
	if s.FrontProxyCA, err = loadCA(dir, FrontProxyCACert, FrontProxyCAKey); err != nil {
		return nil, err
	}
	if s.EtcdCA, err = loadCA(dir, EtcdCACert, EtcdCAKey); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, SAKey))
	if err != nil {
		return nil, incomplete(dir, err)
	}
	if s.SAKey, err = pki.DecodeKeyPEM(data); err != nil {
		return nil, fmt.Errorf("cluster PKI: %s: %w", filepath.Join(dir, SAKey), err)
	}
	if s.EncryptionKey, err = os.ReadFile(filepath.Join(dir, EncryptionKey)); err != nil {
		return nil, incomplete(dir, err)
	}
	s.EncryptionKey = bytes.TrimSpace(s.EncryptionKey)
	return s, nil
}

func incomplete(dir string, err error) error {
	return fmt.Errorf("cluster PKI in %s is incomplete: %w; restore it from a backup, or start over with `controlplane-bootstrap reset` (which deletes the cluster)", dir, err)
}

func loadCA(dir, certPath, keyPath string) (*pki.CA, error) {
	kp, err := pki.LoadKeyPair(filepath.Join(dir, certPath), filepath.Join(dir, keyPath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, incomplete(dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster PKI: %w", err)
	}
	if !kp.Cert.IsCA {
		return nil, fmt.Errorf("cluster PKI: %s is not a CA certificate", filepath.Join(dir, certPath))
	}
	return &pki.CA{Cert: kp.Cert, Key: kp.Key}, nil
}

// APIServerSANs returns the names the apiserver's serving certificate covers: the
// kubernetes Service's names and ClusterIP, localhost, the node name, the advertise
// address, the endpoint's host, apiServer.certSANs and the floating address
// (apiServer.vip).
func APIServerSANs(cfg *clusterconfig.Config) ([]string, []net.IP) {
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + cfg.Networking.DNSDomain, "localhost", cfg.NodeName}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(cfg.APIServer.AdvertiseAddress)}
	if ip := cfg.ServiceIP(); ip != nil {
		ips = append(ips, ip)
	}
	if host, _, err := net.SplitHostPort(cfg.APIServer.Endpoint); err == nil {
		if ip := net.ParseIP(host); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, host)
		}
	}
	for _, san := range cfg.APIServer.CertSANs {
		if ip := net.ParseIP(san); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, san)
		}
	}
	// The floating address (apiServer.vip), which clients reach whichever host holds it,
	// also when apiServer.endpoint names something else.
	if ip, ok := cfg.APIServer.VIP.IP(); ok {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return dedupStrings(dns), dedupIPs(ips)
}

func (s *Set) leaves(cfg *clusterconfig.Config) []leaf {
	dns, ips := APIServerSANs(cfg)
	etcdDNS := dedupStrings([]string{"localhost", cfg.NodeName})
	etcdIPs := dedupIPs([]net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(cfg.APIServer.AdvertiseAddress)})
	both := []pki.Usage{pki.ServerAuth, pki.ClientAuth}
	client := []pki.Usage{pki.ClientAuth}
	return []leaf{
		{APIServerCert, APIServerKey, "ca", pki.CertRequest{CommonName: "kube-apiserver", DNSNames: dns, IPs: ips, Usages: []pki.Usage{pki.ServerAuth}}},
		{APIServerKubeletCert, APIServerKubeletKey, "ca", pki.CertRequest{CommonName: APIServerKubeletUser, Organizations: []string{APIServerKubeletGroup}, Usages: client}},
		{FrontProxyClientCert, FrontProxyClientKey, "front-proxy", pki.CertRequest{CommonName: FrontProxyClientUser, Usages: client}},
		{APIServerEtcdCert, APIServerEtcdKey, "etcd", pki.CertRequest{CommonName: APIServerEtcdClientCN, Usages: client}},
		{EtcdServerCert, EtcdServerKey, "etcd", pki.CertRequest{CommonName: cfg.NodeName, DNSNames: etcdDNS, IPs: etcdIPs, Usages: both}},
		{EtcdPeerCert, EtcdPeerKey, "etcd", pki.CertRequest{CommonName: cfg.NodeName, DNSNames: etcdDNS, IPs: etcdIPs, Usages: both}},
		{EtcdHealthcheckCert, EtcdHealthcheckKey, "etcd", pki.CertRequest{CommonName: EtcdHealthcheckClientC, Usages: client}},
		{MonitoringClientCert, MonitoringClientKey, "ca", pki.CertRequest{CommonName: MonitoringUser, DNSNames: []string{MonitoringSAN}, Usages: client}},
		{LogsGatewayCert, LogsGatewayKey, "ca", pki.CertRequest{CommonName: LogsGatewayCN, DNSNames: dns, IPs: logsGatewayIPs(cfg, ips), Usages: []pki.Usage{pki.ServerAuth}}},
		{KueueServingCert, KueueServingKey, "ca", pki.CertRequest{CommonName: KueueServingCN, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}}},
		registryLeaf(cfg),
	}
}

// registryLeaf is the registry's serving certificate. It is issued with the registry off
// too, as the Kueue and log gateway certificates are, so that `certs renew all` and
// `certs check-expiration` find it either way.
func registryLeaf(cfg *clusterconfig.Config) leaf {
	dns, ips := RegistrySANs(cfg)
	return leaf{RegistryCert, RegistryKey, "ca", pki.CertRequest{CommonName: RegistryCN, DNSNames: dns, IPs: ips, Usages: []pki.Usage{pki.ServerAuth}}}
}

// RegistrySANs returns the names the registry's serving certificate covers: RegistrySAN,
// the advertise address, and registry.certSANs.
func RegistrySANs(cfg *clusterconfig.Config) ([]string, []net.IP) {
	dns := []string{RegistrySAN}
	ips := []net.IP{net.ParseIP(cfg.APIServer.AdvertiseAddress)}
	for _, san := range cfg.Registry.CertSANs {
		if ip := net.ParseIP(san); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, san)
		}
	}
	return dedupStrings(dns), dedupIPs(ips)
}

// logsGatewayIPs are the API server's addresses and the gateway's own listen address
// when it is a specific one (monitoring.logs.gateway.listenAddress).
func logsGatewayIPs(cfg *clusterconfig.Config, apiIPs []net.IP) []net.IP {
	ip := net.ParseIP(cfg.Monitoring.Logs.Gateway.ListenAddress)
	if ip == nil || ip.IsUnspecified() {
		return apiIPs
	}
	return dedupIPs(append(slices.Clone(apiIPs), ip))
}

func (s *Set) caFor(name string) *pki.CA {
	switch name {
	case "front-proxy":
		return s.FrontProxyCA
	case "etcd":
		return s.EtcdCA
	}
	return s.CA
}

// ensureLeaf keeps l's files if they load, were signed by l's CA and cover
// every requested name; otherwise it issues and writes the pair again.
func (s *Set) ensureLeaf(l leaf) error {
	ca := s.caFor(l.ca)
	certPath, keyPath := filepath.Join(s.Dir, l.cert), filepath.Join(s.Dir, l.key)
	if kp, err := pki.LoadKeyPair(certPath, keyPath); err == nil && covers(kp.Cert, ca, l.req) {
		return nil
	}
	req := l.req
	req.Validity = s.LeafValidity
	kp, err := ca.Issue(req)
	if err != nil {
		return fmt.Errorf("cluster PKI: %s: %w", l.cert, err)
	}
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	if err := pki.SaveKeyPair(certPath, keyPath, kp); err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	return nil
}

// covers reports whether cert was signed by ca and names every SAN in req.
func covers(cert *x509.Certificate, ca *pki.CA, req pki.CertRequest) bool {
	if cert.CheckSignatureFrom(ca.Cert) != nil || cert.Subject.CommonName != req.CommonName {
		return false
	}
	for _, d := range req.DNSNames {
		if !slices.Contains(cert.DNSNames, d) {
			return false
		}
	}
	for _, ip := range req.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// IssueClient issues a client certificate from the cluster CA (kubeconfig
// identities: CN is the user name, O the groups).
func (s *Set) IssueClient(user string, groups ...string) (*pki.KeyPair, error) {
	return s.CA.Issue(pki.CertRequest{CommonName: user, Organizations: groups, Usages: []pki.Usage{pki.ClientAuth}, Validity: s.LeafValidity})
}

// CACertPEM returns the cluster CA certificate in PEM.
func (s *Set) CACertPEM() []byte { return pki.EncodeCertPEM(s.CA.Cert) }

// CAPin returns the cluster CA's pin in kubeadm's
// --discovery-token-ca-cert-hash form, "sha256:<hex>".
func (s *Set) CAPin() string { return pki.SPKIPin(s.CA.Cert) }

// Path returns the absolute path of a PKI file named by one of the constants.
func (s *Set) Path(rel string) string { return filepath.Join(s.Dir, rel) }

// parseAnyKey reads a PKCS#8, SEC1 (EC) or PKCS#1 (RSA) private key PEM.
func parseAnyKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	switch block.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", k)
	}
	return signer, nil
}

func writeFile(path string, data []byte, perm fs.FileMode) error {
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("cluster PKI: %w", err)
	}
	return nil
}

func dedupStrings(in []string) []string {
	var out []string
	for _, s := range in {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func dedupIPs(in []net.IP) []net.IP {
	var out []net.IP
	for _, ip := range in {
		if ip != nil && !slices.ContainsFunc(out, ip.Equal) {
			out = append(out, ip)
		}
	}
	return out
}

package kubejoin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// Real-node join (CONTRACTS §6): kubelet, shipped by the image but not enabled, does the
// TLS bootstrap itself. The agent writes only its bootstrap kubeconfig and config.yaml,
// sets the node name as the transient hostname and starts kubelet.service; it then uses
// the kubeconfig kubelet obtained as the node's credentials.

// KubeletPaths are the files kubelet.service names (CONTRACTS §6). Tests point them
// elsewhere.
type KubeletPaths struct {
	BootstrapKubeconfig string // written by the agent
	Config              string // written by the agent
	Kubeconfig          string // written by kubelet after TLS bootstrap; read by the agent
	// ClientCA, written by the agent, is the cluster CA kubelet checks client
	// certificates against (authentication.x509.clientCAFile): the apiserver's
	// kubelet client for logs, exec and port-forward. Empty: kubelet accepts no
	// client certificate, and `kubectl logs` to the node fails.
	ClientCA string
}

// DefaultKubeletPaths are the paths kubelet.service uses.
var DefaultKubeletPaths = KubeletPaths{
	BootstrapKubeconfig: "/var/lib/kubelet/bootstrap-kubeconfig",
	Config:              "/var/lib/kubelet/config.yaml",
	Kubeconfig:          "/var/lib/kubelet/kubeconfig",
	ClientCA:            "/var/lib/kubelet/cluster-ca.crt",
}

// ContainerdEndpoint is the CRI socket of the image's containerd.
const ContainerdEndpoint = "unix:///run/containerd/containerd.sock"

// KubeletJoin is what the kubelet files are made from: the JoinBundle's cluster,
// token, node taints and DNS settings.
type KubeletJoin struct {
	Server        string
	ClusterCAPEM  []byte
	Token         string
	Taints        []TaintSpec
	ClusterDNS    []string
	ClusterDomain string
	CgroupDriver  string // "systemd" or "cgroupfs" (DetectCgroupDriver)
	// ResolvConf is kubelet's resolvConf, the resolvers pods with dnsPolicy Default
	// (CoreDNS) get and ClusterFirst pods' search path; empty: kubelet's default,
	// /etc/resolv.conf (DetectResolvConf).
	ResolvConf string
	// ClientCAFile is kubelet's authentication.x509.clientCAFile (WriteKubeletFiles
	// sets it to KubeletPaths.ClientCA and writes ClusterCAPEM there).
	ClientCAFile string
}

// ResolvedUpstream is systemd-resolved's list of the machine's real resolvers.
const ResolvedUpstream = "/run/systemd/resolve/resolv.conf"

// DetectResolvConf returns the resolv.conf kubelet should hand pods, as kubeadm
// decides it: where /etc/resolv.conf (under root) names only systemd-resolved's stub
// (127.0.0.53), the upstream list resolved keeps, ResolvedUpstream; otherwise ""
// (kubelet's default). A pod's loopback is its own: the stub there is nobody, or,
// for CoreDNS listening on every address, CoreDNS itself, whose loop plugin then
// stops it ("Loop ... detected").
func DetectResolvConf(root string) string {
	data, err := os.ReadFile(filepath.Join(root, "etc/resolv.conf"))
	if err != nil {
		return ""
	}
	stubOnly, found := true, false
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" {
			found = true
			if ip, err := netip.ParseAddr(f[1]); err != nil || !ip.IsLoopback() {
				stubOnly = false
			}
		}
	}
	if !found || !stubOnly {
		return ""
	}
	if _, err := os.Stat(filepath.Join(root, ResolvedUpstream)); err != nil {
		return ""
	}
	return ResolvedUpstream
}

// TaintSpec is a taint as kubelet's registerWithTaints takes it.
type TaintSpec struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// cgroup2SuperMagic is statfs(2) f_type of a cgroup v2 mount (linux/magic.h).
const cgroup2SuperMagic = 0x63677270

// DetectCgroupDriver returns kubelet's cgroup driver for the machine: "systemd" when
// cgroupRoot (normally /sys/fs/cgroup) is a cgroup v2 unified hierarchy (the image's
// systemd and containerd's SystemdCgroup = true), "cgroupfs" on v1 or hybrid hosts.
func DetectCgroupDriver(cgroupRoot string) (string, error) {
	v2, err := isCgroup2(cgroupRoot)
	if err != nil {
		return "", fmt.Errorf("detect cgroup driver: %w", err)
	}
	if v2 {
		return "systemd", nil
	}
	return "cgroupfs", nil
}

// NodeStatusUpdateFrequency is how often kubelet computes its Node's status. It posts
// the status only when it changed (the node Lease carries the heartbeat), so a
// shorter period costs a read from the apiserver's cache per node and period, and
// brings a GPU the device plugin withdrew out of the Node's allocatable within about
// this long, instead of kubelet's default 10 s (decision 0630).
const NodeStatusUpdateFrequency = "1s"

// KubeletConfig renders config.yaml (kubelet.config.k8s.io/v1beta1 KubeletConfiguration):
// registerWithTaints gpurack.io/unvalidated:NoSchedule plus the bundle's taints, the
// detected cgroup driver, containerd's endpoint, client certificate rotation, webhook
// authentication and authorization (kubeadm's defaults), and NodeStatusUpdateFrequency.
func KubeletConfig(j KubeletJoin) ([]byte, error) {
	if j.CgroupDriver != "systemd" && j.CgroupDriver != "cgroupfs" {
		return nil, fmt.Errorf("kubelet config: cgroup driver %q, want systemd or cgroupfs", j.CgroupDriver)
	}
	taints := []TaintSpec{{Key: nodecontract.TaintUnvalidated, Effect: "NoSchedule"}}
	for _, t := range j.Taints {
		if t.Key != nodecontract.TaintUnvalidated {
			taints = append(taints, t)
		}
	}
	authn := map[string]any{
		"anonymous": map[string]any{"enabled": false},
		"webhook":   map[string]any{"enabled": true},
	}
	if j.ClientCAFile != "" {
		authn["x509"] = map[string]any{"clientCAFile": j.ClientCAFile}
	}
	cfg := map[string]any{
		"apiVersion":                "kubelet.config.k8s.io/v1beta1",
		"kind":                      "KubeletConfiguration",
		"cgroupDriver":              j.CgroupDriver,
		"containerRuntimeEndpoint":  ContainerdEndpoint,
		"registerWithTaints":        taints,
		"rotateCertificates":        true,
		"authentication":            authn,
		"authorization":             map[string]any{"mode": "Webhook"},
		"nodeStatusUpdateFrequency": NodeStatusUpdateFrequency,
	}
	if len(j.ClusterDNS) > 0 {
		cfg["clusterDNS"] = j.ClusterDNS
	}
	if j.ClusterDomain != "" {
		cfg["clusterDomain"] = j.ClusterDomain
	}
	if j.ResolvConf != "" {
		cfg["resolvConf"] = j.ResolvConf
	}
	return yaml.Marshal(cfg)
}

// BootstrapKubeconfig renders kubelet's bootstrap kubeconfig: the cluster endpoint and
// CA, and the bootstrap token as the user's bearer token.
func BootstrapKubeconfig(j KubeletJoin) ([]byte, error) {
	if j.Server == "" || len(j.ClusterCAPEM) == 0 || j.Token == "" {
		return nil, errors.New("bootstrap kubeconfig: the JoinBundle needs api_server_endpoint, cluster_ca_pem and bootstrap_token")
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: j.Server, CertificateAuthorityData: j.ClusterCAPEM}
	cfg.AuthInfos["kubelet-bootstrap"] = &clientcmdapi.AuthInfo{Token: j.Token}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "kubelet-bootstrap"}
	cfg.CurrentContext = "default"
	return clientcmd.Write(*cfg)
}

// WriteKubeletFiles writes the bootstrap kubeconfig (0600: it holds the token) and
// config.yaml, each atomically.
func WriteKubeletFiles(p KubeletPaths, j KubeletJoin) error {
	kc, err := BootstrapKubeconfig(j)
	if err != nil {
		return err
	}
	if p.ClientCA != "" {
		j.ClientCAFile = p.ClientCA
	}
	conf, err := KubeletConfig(j)
	if err != nil {
		return err
	}
	if p.ClientCA != "" {
		if err := atomicfile.WriteMkdirAll(p.ClientCA, j.ClusterCAPEM, 0o644, 0o755); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteMkdirAll(p.BootstrapKubeconfig, kc, 0o600, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteMkdirAll(p.Config, conf, 0o644, 0o755)
}

// Host is the part of systemd the real-node join needs: the transient hostname
// (org.freedesktop.hostname1) and starting a unit (org.freedesktop.systemd1). The D-Bus
// implementation is SystemdHost; tests use a fake, since the hosts CI runs on have no
// systemd as PID 1.
type Host interface {
	SetTransientHostname(ctx context.Context, name string) error
	StartUnit(ctx context.Context, unit string) error
}

// ServiceHost also runs services of the agent's own, outside its unit (SystemdHost).
type ServiceHost interface {
	// EnsureService starts argv as the transient service unit, or leaves it running
	// when it already is; started says which.
	EnsureService(ctx context.Context, unit, description string, argv []string) (started bool, err error)
}

// KubeletUnit is the unit the image ships, not enabled (CONTRACTS §6).
const KubeletUnit = "kubelet.service"

// StartKubelet does the real-node join up to kubelet's start: hostname, files, unit.
func StartKubelet(ctx context.Context, h Host, p KubeletPaths, nodeName string, j KubeletJoin) error {
	if err := h.SetTransientHostname(ctx, nodeName); err != nil {
		return fmt.Errorf("set hostname %s: %w", nodeName, err)
	}
	if err := WriteKubeletFiles(p, j); err != nil {
		return err
	}
	if err := h.StartUnit(ctx, KubeletUnit); err != nil {
		return fmt.Errorf("start %s: %w", KubeletUnit, err)
	}
	return nil
}

package hostnode

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// nodeSettings are what Start chose for a node besides its Options.
type nodeSettings struct {
	kubelet, pauseTar, cgroupRoot string
	port, healthzPort             int
}

// containerdSock is containerd's socket.
func (n *Node) containerdSock() string { return filepath.Join(n.Dir, "containerd.sock") }

// configFiles are the node's files by path under n.Dir: containerd's and kubelet's
// configuration, the CNI network, the bootstrap kubeconfig, and node.sh, which starts
// them.
func (n *Node) configFiles(c *testcluster.Cluster, o Options, s nodeSettings) map[string]string {
	criExtra := ""
	if o.CRIConfig != nil {
		criExtra = o.CRIConfig(n)
	}
	return map[string]string{
		"containerd.toml":              n.containerdConfig(criExtra),
		"cni/10-gpurack-test.conflist": n.cniConfig(),
		"ca.crt":                       string(c.CAPEM),
		"bootstrap.kubeconfig":         n.bootstrapKubeconfig(c.Server),
		"kubelet.yaml":                 n.kubeletConfig(s, o.KubeletConfig),
		"node.sh":                      n.script(s, o.Images),
	}
}

func (n *Node) containerdConfig(criExtra string) string {
	sock := n.containerdSock()
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
%[9]s
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = %[8]q
`, filepath.Join(n.Dir, "containerd", "root"), filepath.Join(n.Dir, "containerd", "state"), sock, sock+".ttrpc",
		filepath.Join(n.Dir, "containerd", "opt"), n.PauseImage, filepath.Join(n.Dir, "cni"), n.RuncRoot(), criExtra)
}

func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{"cniVersion": "0.4.0", "name": %q, "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
`, filepath.Base(n.Dir), filepath.Join(n.Dir, "cni-ipam"))
}

func (n *Node) bootstrapKubeconfig(server string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority: %q}
users:
- name: bootstrap
  user: {token: %q}
contexts:
- name: c
  context: {cluster: c, user: bootstrap}
current-context: c
`, server, filepath.Join(n.Dir, "ca.crt"), n.Token)
}

// kubeletConfig is the KubeletConfiguration, with extra (YAML) added at its top level.
func (n *Node) kubeletConfig(s nodeSettings, extra string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %q
containerRuntimeEndpoint: unix://%s
failSwapOn: false
rotateCertificates: true
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
podLogsDir: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
evictionHard: {}
imageGCHighThresholdPercent: 100
%s
`, s.cgroupRoot, n.containerdSock(), s.port, s.healthzPort, filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "ca.crt"), extra)
}

// script is node.sh: containerd, the image imports (the pause image's and images),
// then kubelet, which runs again after RestartKubelet kills it (the restart file says
// the exit was asked for); any other exit ends the script, which Exited reports.
func (n *Node) script(s nodeSettings, images []string) string {
	sock := n.containerdSock()
	var imports strings.Builder
	for _, im := range append([]string{s.pauseTar}, images...) {
		fmt.Fprintf(&imports, "ctr -a %s -n k8s.io images import %s >>%s/import.log 2>&1\n", sock, im, n.Dir)
	}
	return fmt.Sprintf(`set -e
mkdir -p %[1]s/device-plugins /var/lib/kubelet/device-plugins
mount --bind %[1]s/device-plugins /var/lib/kubelet/device-plugins
containerd --config %[1]s/containerd.toml >%[1]s/containerd.log 2>&1 &
for i in $(seq 100); do [ -S %[2]s ] && break; sleep 0.1; done
%[3]swhile :; do
  %[4]s --config=%[1]s/kubelet.yaml --bootstrap-kubeconfig=%[1]s/bootstrap.kubeconfig \
    --kubeconfig=%[1]s/kubelet.kubeconfig --cert-dir=%[1]s/pki --root-dir=%[6]s \
    --hostname-override=%[5]s --node-ip=127.0.0.1 >>%[1]s/kubelet.log 2>&1 || true
  [ -e %[1]s/kubelet.restart ] || exit 1
  rm %[1]s/kubelet.restart
done
`, n.Dir, sock, imports.String(), s.kubelet, n.Name, n.KubeletDir())
}

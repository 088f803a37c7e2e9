// Package podnet is the node's pod network (decisions 0600, 0601): once the node has
// joined, it waits for the podCIDR kube-controller-manager allocates to the Node,
// checks the CNI plugins and the boot network, brings up the cross-node network
// (flannel, embedded) and writes the CNI conflist (bridge + host-local + portmap) that
// lets kubelet report the node Ready. It runs with the node's own identity: the
// kubeconfig kubelet keeps for its rotated client certificate, system:node:NAME.
package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// Defaults of the image (imagebuilder/rootfs/node.go: containerd's CRI cni section).
const (
	DefaultCNIBinDir  = "/usr/lib/cni"
	DefaultCNIConfDir = "/etc/cni/net.d"
	// ConflistName sorts first in the conf dir, so containerd picks it.
	ConflistName = "10-gpurack.conflist"
	// BridgeName is the node's pod bridge.
	BridgeName = "cni0"
)

// RequiredPlugins are the CNI plugins the conflist names, plus loopback, which
// containerd runs for every pod.
var RequiredPlugins = []string{"bridge", "host-local", "portmap", "loopback"}

// WaitingForPodCIDR is what the service says while the Node has no spec.podCIDR.
const WaitingForPodCIDR = "waiting for podCIDR from kube-controller-manager (is --allocate-node-cidrs on?)"

// MissingPluginError is a CNI plugin binary the conflist needs and the image lacks.
type MissingPluginError struct {
	Dir, Plugin string
	Err         error
}

func (e *MissingPluginError) Error() string {
	return fmt.Sprintf("CNI plugin %q missing from %s (%v): the image needs Debian's containernetworking-plugins", e.Plugin, e.Dir, e.Err)
}

// ErrMissingPlugin matches every MissingPluginError (errors.Is).
var ErrMissingPlugin = errors.New("CNI plugin missing")

// Is makes errors.Is(err, ErrMissingPlugin) hold.
func (e *MissingPluginError) Is(target error) bool { return target == ErrMissingPlugin }

// OverlapError is a pod network that overlaps a network the machine is on (the boot
// network, say): pods could not reach those hosts, and the node's own routes would
// fight the pod routes.
type OverlapError struct {
	// What overlaps: "podCIDR" or "pod network".
	What      string
	Pods      netip.Prefix
	Interface string
	Host      netip.Prefix
}

func (e *OverlapError) Error() string {
	return fmt.Sprintf("%s %s overlaps %s on %s, the network this machine boots from: choose a networking.podSubnet in the cluster configuration that overlaps no machine network", e.What, e.Pods, e.Host, e.Interface)
}

// ErrOverlap matches every OverlapError (errors.Is).
var ErrOverlap = errors.New("pod network overlaps a host network")

// Is makes errors.Is(err, ErrOverlap) hold.
func (e *OverlapError) Is(target error) bool { return target == ErrOverlap }

// ErrNoNFTables matches every NoNFTablesError (errors.Is).
var ErrNoNFTables = errors.New("no nftables")

// OutsidePodSubnetError is a Node podCIDR outside the pod network the node was
// configured with: the cluster's networking.podSubnet and the profile's disagree.
type OutsidePodSubnetError struct{ PodCIDR, PodSubnet netip.Prefix }

func (e *OutsidePodSubnetError) Error() string {
	return fmt.Sprintf("podCIDR %s is outside the pod network %s: set kubernetes.podNetwork.podSubnet in the profile to the cluster's networking.podSubnet", e.PodCIDR, e.PodSubnet)
}

// CheckPlugins returns a MissingPluginError for the first required plugin that is
// not an executable file in dir.
func CheckPlugins(dir string) error {
	for _, p := range RequiredPlugins {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err == nil && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0) {
			err = fmt.Errorf("%s is not an executable file", fi.Mode())
		}
		if err != nil {
			return &MissingPluginError{Dir: dir, Plugin: p, Err: err}
		}
	}
	return nil
}

// HostNetwork is one address of the machine with its prefix.
type HostNetwork struct {
	Interface string
	Prefix    netip.Prefix
}

// HostNetworks are the machine's IPv4 and IPv6 global unicast networks, leaving out
// the pod network's own devices (the bridge, flannel's).
func HostNetworks() ([]HostNetwork, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []HostNetwork
	for _, ifc := range ifs {
		if ifc.Name == BridgeName || strings.HasPrefix(ifc.Name, "flannel") || strings.HasPrefix(ifc.Name, "veth") {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || !ipn.IP.IsGlobalUnicast() {
				continue
			}
			addr, _ := netip.AddrFromSlice(ipn.IP)
			ones, _ := ipn.Mask.Size()
			out = append(out, HostNetwork{Interface: ifc.Name, Prefix: netip.PrefixFrom(addr.Unmap(), ones).Masked()})
		}
	}
	return out, nil
}

// CheckOverlap returns an OverlapError when pods (named what) overlaps one of hosts.
func CheckOverlap(what string, pods netip.Prefix, hosts []HostNetwork) error {
	for _, h := range hosts {
		if h.Prefix.Overlaps(pods) {
			return &OverlapError{What: what, Pods: pods, Interface: h.Interface, Host: h.Prefix}
		}
	}
	return nil
}

// WaitPodCIDR watches the Node name until it has a spec.podCIDR and returns it.
// report gets what it waits for each time that changes.
func WaitPodCIDR(ctx context.Context, client kubernetes.Interface, name string, report func(string)) (netip.Prefix, error) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return client.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return client.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	last := ""
	say := func(msg string) {
		if msg != last {
			last = msg
			report(msg)
		}
	}
	say("waiting for Node " + name + " to register")
	var cidr netip.Prefix
	var perr error
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		n, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type == watch.Deleted {
			return false, nil
		}
		if msg := waitingFor(n); msg != "" {
			say(msg)
			return false, nil
		}
		cidr, perr = netip.ParsePrefix(n.Spec.PodCIDR)
		return true, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return netip.Prefix{}, ctx.Err()
		}
		return netip.Prefix{}, fmt.Errorf("watching Node %s for its podCIDR: %w", name, err)
	}
	if perr != nil {
		return netip.Prefix{}, fmt.Errorf("spec.podCIDR of Node %s: %w", name, perr)
	}
	return cidr.Masked(), nil
}

// waitingFor is what a Node still lacks for the pod network, "" when nothing.
func waitingFor(n *corev1.Node) string {
	if n.Spec.PodCIDR == "" {
		return WaitingForPodCIDR
	}
	return ""
}

// Conflist renders the CNI network configuration of a node whose pods take addresses
// from podCIDR: the bridge plugin on cni0 as the pods' gateway, host-local addresses,
// portmap for hostPort. mtu 0 leaves the bridge's default. masq: the bridge plugin
// masquerades traffic leaving podCIDR itself (when no other part of the pod network
// does).
func Conflist(podCIDR netip.Prefix, mtu int, masq bool) ([]byte, error) {
	if !podCIDR.IsValid() {
		return nil, errors.New("conflist: no podCIDR")
	}
	def := "0.0.0.0/0"
	if podCIDR.Addr().Is6() {
		def = "::/0"
	}
	bridge := map[string]any{
		"type": "bridge", "bridge": BridgeName, "isGateway": true, "ipMasq": masq, "hairpinMode": true,
		"ipam": map[string]any{
			"type":   "host-local",
			"ranges": [][]map[string]string{{{"subnet": podCIDR.String()}}},
			"routes": []map[string]string{{"dst": def}},
		},
	}
	if mtu > 0 {
		bridge["mtu"] = mtu
	}
	return json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "gpurack",
		"plugins": []any{
			bridge,
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		},
	}, "", "  ")
}

// WriteConflist writes Conflist's output to dir/ConflistName atomically (containerd
// watches the directory and must never read half a file).
func WriteConflist(dir string, podCIDR netip.Prefix, mtu int, masq bool) (string, error) {
	b, err := Conflist(podCIDR, mtu, masq)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("CNI conf dir: %w", err)
	}
	path := filepath.Join(dir, ConflistName)
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("CNI conflist: %w", err)
	}
	return path, nil
}

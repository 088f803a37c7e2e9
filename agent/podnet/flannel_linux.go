package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/flannel-io/flannel/pkg/backend"
	_ "github.com/flannel-io/flannel/pkg/backend/hostgw" // registers host-gw
	_ "github.com/flannel-io/flannel/pkg/backend/vxlan"  // registers vxlan
	"github.com/flannel-io/flannel/pkg/ip"
	"github.com/flannel-io/flannel/pkg/ipmatch"
	"github.com/flannel-io/flannel/pkg/subnet/kube"
	"github.com/flannel-io/flannel/pkg/trafficmngr/nftables"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// flannelPrefix is flannel's annotation prefix on Nodes (flannel.alpha.coreos.com/...),
// the same as a stand-alone flannel's, so the two could not both run unnoticed.
const flannelPrefix = "flannel.alpha.coreos.com"

// resyncSeconds is how often flannel's traffic manager re-checks its rules.
const resyncSeconds = 5

// NoNFTablesError is a kernel (or image) where flannel's nftables traffic manager
// cannot make its tables.
type NoNFTablesError struct{ Err error }

func (e *NoNFTablesError) Error() string {
	return fmt.Sprintf("nftables unavailable (%v): the pod network needs a kernel with nf_tables (5.13 or newer) and the nft command from Debian's nftables package", e.Err)
}

func (e *NoNFTablesError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNoNFTables) hold.
func (e *NoNFTablesError) Is(target error) bool { return target == ErrNoNFTables }

// startFlannel runs flannel's kube subnet manager and backend in this process, the
// way k3s embeds it: the lease is the Node's podCIDR, published in the Node's
// flannel annotations with the node's own credential; the backend (vxlan or host-gw)
// routes the other Nodes' podCIDRs; the nftables traffic manager masquerades pod
// traffic leaving the pod network and accepts its forwarding. It returns the MTU the
// pods must use. The goroutines it starts stop with ctx and are counted in wg.
func startFlannel(ctx context.Context, wg *sync.WaitGroup, cfg Config, podSubnet netip.Prefix) (int, error) {
	// kube.NewSubnetManager reads the node name from the environment.
	if err := os.Setenv("NODE_NAME", cfg.NodeName); err != nil {
		return 0, err
	}
	netConf, err := json.Marshal(map[string]any{
		"Network": podSubnet.String(), "EnableIPv4": true, "EnableNFTables": true,
		"Backend": map[string]string{"Type": cfg.Backend},
	})
	if err != nil {
		return 0, err
	}
	confPath := filepath.Join(cfg.RunDir, "net-conf.json")
	if err := atomicfile.WriteMkdirAll(confPath, netConf, 0o644, 0o755); err != nil {
		return 0, fmt.Errorf("pod network: %w", err)
	}
	sm, err := kube.NewSubnetManager(ctx, "", cfg.Kubeconfig, flannelPrefix, confPath, false)
	if err != nil {
		return 0, fmt.Errorf("pod network: flannel's subnet manager: %w", err)
	}
	config, err := sm.GetNetworkConfig(ctx)
	if err != nil {
		return 0, fmt.Errorf("pod network: %w", err)
	}
	ext, err := ipmatch.LookupExtIface("", "", "", 0, ipmatch.PublicIPOpts{})
	if err != nil {
		return 0, fmt.Errorf("pod network: no interface for node-to-node traffic (flannel looks for the default route's): %w", err)
	}
	be, err := backend.NewManager(ctx, sm, ext).GetBackend(config.BackendType)
	if err != nil {
		return 0, fmt.Errorf("pod network: flannel backend %q: %w", config.BackendType, err)
	}
	bn, err := be.RegisterNetwork(ctx, wg, config)
	if err != nil {
		return 0, fmt.Errorf("pod network: flannel %s on %s: %w", config.BackendType, ext.Iface.Name, err)
	}
	tm := &nftables.NFTablesManager{}
	if err := tm.Init(ctx); err != nil {
		return 0, &NoNFTablesError{Err: err}
	}
	if err := tm.SetupAndEnsureMasqRules(ctx, config.Network, ip.IP4Net{}, ip.IP4Net{}, config.IPv6Network, ip.IP6Net{}, ip.IP6Net{},
		bn.Lease(), resyncSeconds, false); err != nil {
		return 0, fmt.Errorf("pod network: masquerade rules: %w", err)
	}
	tm.SetupAndEnsureForwardRules(ctx, config.Network, config.IPv6Network, resyncSeconds)
	wg.Add(2)
	go func() { defer wg.Done(); bn.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := sm.CompleteLease(ctx, bn.Lease(), wg); err != nil && !errors.Is(err, context.Canceled) && cfg.Log != nil {
			cfg.Log.Warn("flannel lease", "error", err)
		}
	}()
	if cfg.Log != nil {
		cfg.Log.Info("flannel running", "backend", config.BackendType, "interface", ext.Iface.Name, "network", podSubnet.String(),
			"subnet", bn.Lease().Subnet.String(), "mtu", bn.MTU())
	}
	return bn.MTU(), nil
}

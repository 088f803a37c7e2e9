package components

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// The floating API address's holder (apiServer.vip; package vip): controlplane-bootstrap
// itself, run as VIPCommand, on every control-plane host with the same address. It
// campaigns in an etcd election through this host's etcd member with the API server's
// etcd client certificate, and adds the address to its interface while it leads.
const (
	VIP = "vip"
	// VIPCommand is the subcommand the holder runs as.
	VIPCommand = "vip"
)

// vipCapabilities are what the holder's systemd unit keeps of root's capabilities:
// CAP_NET_ADMIN to add and delete the address (netlink), CAP_NET_RAW for the packet
// socket it sends gratuitous ARPs on.
var vipCapabilities = []string{"CAP_NET_ADMIN", "CAP_NET_RAW"}

// VIPLeaderURL is the holder's /leader on loopback: the name of the host that holds
// the address now (read from etcd), for `status`.
func VIPLeaderURL(cfg *clusterconfig.Config) string {
	return "http://" + hostPort("127.0.0.1", cfg.APIServer.VIP.HealthPort) + "/leader"
}

// vipSpecs is the holder, when apiServer.vip has an address.
func vipSpecs(cfg *clusterconfig.Config, l Layout) []Component {
	if !cfg.APIServer.VIP.Enabled() {
		return nil
	}
	return []Component{vipSpec(cfg, l)}
}

func vipSpec(cfg *clusterconfig.Config, l Layout) Component {
	v := cfg.APIServer.VIP
	health := hostPort("127.0.0.1", v.HealthPort)
	flags := map[string]string{
		"address":   v.Address,
		"interface": v.Interface,
		"ttl":       v.TTL.String(),
		// This host's member, with the API server's client credentials: the election
		// is only as available as the API server's own storage.
		"etcd":          "https://" + hostPort("127.0.0.1", cfg.Etcd.ClientPort),
		"etcd-ca":       l.PKI(clusterpki.EtcdCACert),
		"etcd-cert":     l.PKI(clusterpki.APIServerEtcdCert),
		"etcd-key":      l.PKI(clusterpki.APIServerEtcdKey),
		"health-listen": health,
	}
	if cfg.NodeName != "" {
		flags["name"] = cfg.NodeName
	}
	return Component{
		Name:            VIP,
		Self:            true,
		Args:            append([]string{VIPCommand}, render(flags, nil)...),
		Ports:           []Port{{"127.0.0.1", v.HealthPort, "apiServer.vip.healthPort"}},
		HealthURL:       "http://" + health + "/healthz",
		Capabilities:    vipCapabilities,
		AddressFamilies: []string{"AF_PACKET"},
	}
}

// VIPHolder asks the holder on this host (its /leader at url, VIPLeaderURL) which host
// holds the floating address now: its name, or "" when none does. The holder reads it
// from etcd; an error says why it could not be told (the holder is not running, etcd
// cannot be read).
func VIPHolder(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: %s", url, describeDialError(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: HTTP %d: %s", url, resp.StatusCode, firstLine(text))
	}
	return text, nil
}

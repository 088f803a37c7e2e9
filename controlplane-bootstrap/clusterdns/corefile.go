package clusterdns

import (
	"fmt"
	"net/netip"
	"strings"
)

// CorefileConfig is what varies between the Corefile the cluster runs and one a
// test runs on loopback. Every address is HOST:PORT, or :PORT for every interface.
type CorefileConfig struct {
	// Domain is the cluster domain (cluster.local).
	Domain string
	// Port is the DNS port (53).
	Port int
	// Bind, when set, is the one address the DNS server listens on; empty: every
	// address of the pod.
	Bind string
	// Health is the liveness endpoint (/health), Ready the readiness endpoint
	// (/ready, 200 once the kubernetes plugin has synced), Metrics Prometheus'.
	Health, Ready, Metrics string
	// Upstream is where names outside the cluster go: /etc/resolv.conf (the
	// node's resolvers, with dnsPolicy Default) or resolver addresses.
	Upstream []string
	// Kubeconfig, when set, is the credential the kubernetes plugin uses; empty:
	// the pod's service account (in-cluster).
	Kubeconfig string
}

// InCluster is the Corefile configuration of the Deployment: kubeadm's default
// Corefile, on the ports the pod spec and its probes name.
func InCluster(domain string) CorefileConfig {
	return CorefileConfig{
		Domain:   domain,
		Port:     DNSPort,
		Health:   fmt.Sprintf(":%d", HealthPort),
		Ready:    fmt.Sprintf(":%d", ReadyPort),
		Metrics:  fmt.Sprintf(":%d", MetricsPort),
		Upstream: []string{"/etc/resolv.conf"},
	}
}

// Corefile renders c as CoreDNS configuration. It is kubeadm's default Corefile
// (cluster names from the kubernetes plugin, reverse zones falling through to
// the upstream, a 30 s cache that does not cache cluster names, loop detection,
// reload on ConfigMap change) with c's addresses. It fails on a value that would
// change the Corefile's structure (a space, a brace or a newline).
func Corefile(c CorefileConfig) (string, error) {
	if err := c.check(); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, ".:%d {\n", c.Port)
	if c.Bind != "" {
		fmt.Fprintf(&b, "    bind %s\n", c.Bind)
	}
	b.WriteString("    errors\n")
	fmt.Fprintf(&b, "    health %s {\n        lameduck 5s\n    }\n", c.Health)
	fmt.Fprintf(&b, "    ready %s\n", c.Ready)
	fmt.Fprintf(&b, "    kubernetes %s in-addr.arpa ip6.arpa {\n", c.Domain)
	if c.Kubeconfig != "" {
		fmt.Fprintf(&b, "        kubeconfig %s\n", c.Kubeconfig)
	}
	b.WriteString("        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 30\n    }\n")
	fmt.Fprintf(&b, "    prometheus %s\n", c.Metrics)
	fmt.Fprintf(&b, "    forward . %s {\n        max_concurrent 1000\n    }\n", strings.Join(c.Upstream, " "))
	fmt.Fprintf(&b, "    cache 30 {\n        disable success %[1]s\n        disable denial %[1]s\n    }\n", c.Domain)
	b.WriteString("    loop\n    reload\n    loadbalance\n}\n")
	return b.String(), nil
}

func (c CorefileConfig) check() error {
	if c.Domain == "" {
		return fmt.Errorf("corefile: the cluster domain is empty (networking.dnsDomain, for example cluster.local)")
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("corefile: DNS port %d is not in 1-65535", c.Port)
	}
	if len(c.Upstream) == 0 {
		return fmt.Errorf("corefile: no upstream resolver (for example /etc/resolv.conf)")
	}
	if c.Bind != "" {
		if _, err := netip.ParseAddr(c.Bind); err != nil {
			return fmt.Errorf("corefile: bind %q is not an IP address", c.Bind)
		}
	}
	values := append([]string{c.Domain, c.Health, c.Ready, c.Metrics, c.Kubeconfig}, c.Upstream...)
	for _, v := range values {
		if strings.ContainsAny(v, " \t\r\n{}#\"'") {
			return fmt.Errorf("corefile: %q holds a space, quote, brace or '#', which CoreDNS would read as Corefile syntax", v)
		}
	}
	for _, v := range []string{c.Health, c.Ready, c.Metrics} {
		if v == "" {
			return fmt.Errorf("corefile: the health, ready and metrics addresses are all required")
		}
	}
	return nil
}

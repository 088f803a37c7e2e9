// Command coredns is CoreDNS (github.com/coredns/coredns, pinned in this directory's
// go.mod) with only the plugins a Kubernetes cluster's DNS needs: kubernetes, forward,
// cache, errors, log, health, ready, prometheus, loop, reload, loadbalance and bind. The
// upstream main compiles in every plugin (cloud DNS providers, etcd, dnstap, ...);
// this one keeps the dependency set, the binary and what can be configured small.
//
// It is its own Go module because CoreDNS requires a newer k8s.io/client-go than the
// one the rest of gpurack pins (decision 0610). `make coredns-image` builds it and
// packs it into the image archive controlplane-bootstrap's Deployment runs.
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the Corefile directives of the plugins imported above ("prometheus"
// is plugin/metrics). Their order is upstream's: a plugin sees a query after the
// ones before it in dnsserver.Directives.
var directives = []string{
	"reload", "bind", "ready", "health", "prometheus", "errors", "log",
	"loadbalance", "cache", "kubernetes", "loop", "forward",
}

// keepDirectives narrows upstream's ordered directive list to want, so a Corefile
// naming a plugin this build lacks fails with "unknown directive". It fails when
// upstream no longer knows one of want (a renamed plugin after a version bump).
func keepDirectives(upstream, want []string) ([]string, error) {
	for _, d := range want {
		if !slices.Contains(upstream, d) {
			return nil, fmt.Errorf("CoreDNS no longer has the directive %q; update images/coredns/main.go for this CoreDNS version", d)
		}
	}
	return slices.DeleteFunc(slices.Clone(upstream), func(d string) bool { return !slices.Contains(want, d) }), nil
}

func main() {
	kept, err := keepDirectives(dnsserver.Directives, directives)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	dnsserver.Directives = kept
	coremain.Run()
}

package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

func TestKeepDirectivesKeepsUpstreamOrder(t *testing.T) {
	got, err := keepDirectives(dnsserver.Directives, directives)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(directives) {
		t.Fatalf("kept %v, want the %d of %v", got, len(directives), directives)
	}
	// Upstream's order, not ours: cache before kubernetes, kubernetes before
	// forward, so cluster names never reach the upstream resolvers.
	pos := func(d string) int { return slices.Index(got, d) }
	if !(pos("cache") < pos("kubernetes") && pos("kubernetes") < pos("loop") && pos("loop") < pos("forward")) {
		t.Errorf("order %v", got)
	}
	if _, err := keepDirectives([]string{"cache"}, []string{"cache", "kubernetes"}); err == nil || !strings.Contains(err.Error(), `"kubernetes"`) {
		t.Errorf("a directive upstream lacks: %v", err)
	}
}

// TestEveryDirectiveHasItsPlugin: each kept directive is a plugin this binary
// registers, so a Corefile that uses it loads.
func TestEveryDirectiveHasItsPlugin(t *testing.T) {
	for _, d := range directives {
		if _, err := caddy.DirectiveAction("dns", d); err != nil {
			t.Errorf("directive %s: %v: add its import", d, err)
		}
	}
}

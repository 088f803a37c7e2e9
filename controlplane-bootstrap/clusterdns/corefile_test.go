package clusterdns

import (
	"strings"
	"testing"
)

func TestCorefileInCluster(t *testing.T) {
	got, err := Corefile(InCluster("cluster.local"))
	if err != nil {
		t.Fatal(err)
	}
	want := `.:53 {
    errors
    health :8080 {
        lameduck 5s
    }
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
        max_concurrent 1000
    }
    cache 30 {
        disable success cluster.local
        disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`
	if got != want {
		t.Errorf("in-cluster Corefile:\n%s\nwant:\n%s", got, want)
	}
}

func TestCorefileLocal(t *testing.T) {
	c := InCluster("rack.example")
	c.Port, c.Bind, c.Health, c.Ready, c.Metrics = 10053, "127.0.0.1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	c.Upstream, c.Kubeconfig = []string{"127.0.0.1:5353"}, "/etc/coredns/kubeconfig"
	got, err := Corefile(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{".:10053 {", "    bind 127.0.0.1", "    health 127.0.0.1:1 {", "    ready 127.0.0.1:2",
		"    kubernetes rack.example in-addr.arpa ip6.arpa {", "        kubeconfig /etc/coredns/kubeconfig",
		"    prometheus 127.0.0.1:3", "    forward . 127.0.0.1:5353 {", "        disable denial rack.example"} {
		if !strings.Contains(got, line+"\n") {
			t.Errorf("Corefile lacks the line %q:\n%s", line, got)
		}
	}
}

func TestCorefileRefusesSyntaxInValues(t *testing.T) {
	for name, mutate := range map[string]func(*CorefileConfig){
		"empty domain":      func(c *CorefileConfig) { c.Domain = "" },
		"brace in domain":   func(c *CorefileConfig) { c.Domain = "cluster.local }" },
		"newline upstream":  func(c *CorefileConfig) { c.Upstream = []string{"1.1.1.1\nlog"} },
		"no upstream":       func(c *CorefileConfig) { c.Upstream = nil },
		"port 0":            func(c *CorefileConfig) { c.Port = 0 },
		"port too high":     func(c *CorefileConfig) { c.Port = 65536 },
		"bind a name":       func(c *CorefileConfig) { c.Bind = "localhost" },
		"no ready address":  func(c *CorefileConfig) { c.Ready = "" },
		"comment in health": func(c *CorefileConfig) { c.Health = ":8080#x" },
		"space kubeconfig":  func(c *CorefileConfig) { c.Kubeconfig = "/a b" },
	} {
		c := InCluster("cluster.local")
		mutate(&c)
		if s, err := Corefile(c); err == nil {
			t.Errorf("%s: rendered\n%s", name, s)
		} else if !strings.HasPrefix(err.Error(), "corefile: ") {
			t.Errorf("%s: error %q does not say it is the Corefile", name, err)
		}
	}
}

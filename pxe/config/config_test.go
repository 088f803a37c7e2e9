package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExampleParses(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "docs", "examples", "gpuboot.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster.LogsEndpoint != "10.0.0.2:9428" {
		t.Errorf("example cluster.logsEndpoint %q, want 10.0.0.2:9428", c.Cluster.LogsEndpoint)
	}
	if c.Metrics.PrometheusURL != "http://127.0.0.1:9090" {
		t.Errorf("example metrics.prometheusURL %q", c.Metrics.PrometheusURL)
	}
	if c.DHCP.Mode != "proxy" || len(c.Interfaces) != 1 || c.Interfaces[0].Name != "eth0" {
		t.Fatalf("example: mode %q interfaces %v, want proxy on eth0", c.DHCP.Mode, c.Interfaces)
	}
	if c.Listen.HTTP != ":8080" || c.Listen.TLS != ":8443" || c.DefaultRack != "r1" || len(c.Selectors) != 2 {
		t.Fatalf("example: %+v", c)
	}
	// The subnet and the DNS settings come from the cluster (decision 0672): the
	// example leaves them out.
	if pn := c.Cluster.PodNetwork; pn.Subnet != "" || pn.Backend != "vxlan" || len(c.Cluster.DNS) != 0 {
		t.Errorf("example cluster.podNetwork %+v, dns %v: want the backend only", pn, c.Cluster.DNS)
	}
	// An empty podNetwork leaves the profile's settings (the bundle carries none).
	c, err = Parse("g.yaml", []byte(minimal+"cluster: {podNetwork: {}}\n"))
	if err != nil || c.Cluster.PodNetwork != (PodNetwork{}) {
		t.Errorf("cluster: {podNetwork: {}}: %+v, %v", c.Cluster.PodNetwork, err)
	}
}

const minimal = `stateDir: /var/lib/gpuboot
advertise: 192.0.2.1
interfaces: [{name: eth0}]
images: {store: /srv/images, trustedKeys: [/etc/k.pub]}
racks: [{name: r1}]
`

func TestDefaults(t *testing.T) {
	c, err := Parse("g.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if c.DHCP.Mode != "proxy" || c.Enrollment.UnknownMachines != "discover" || c.Enrollment.Reenroll != "auto" || c.Enrollment.Identity != "mac-uuid-serial" ||
		c.Policy.Approval != "manual" || c.DefaultRack != "r1" || c.Inventory.Store != InventoryBolt || !c.DHCPEnabled() || c.Admin.TokensFile != "/var/lib/gpuboot/operator-tokens" {
		t.Fatalf("defaults: %+v", c)
	}
}

// Every problem is reported as FILE:LINE: FIELD: what to fix; minimal is five lines, so
// an appended line is line 6.
func TestErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{minimal + "colour: blue\n", `g.yaml:6: colour: unknown field "colour"; known fields here: stateDir, advertise`},
		{minimal + "dhcp: {mdoe: full}\n", `g.yaml:6: dhcp.mdoe: unknown field "mdoe" (did you mean "mode"?)`},
		{minimal + "dhcp: {mode: sideways}\n", "g.yaml:6: dhcp.mode: \"sideways\""},
		{minimal + "dhcp: {mode: full}\n", "g.yaml:6: dhcp.pool: required"},
		{minimal + "dhcp:\n  mode: full\n  pool:\n    start: 10.0.0.300\n", "g.yaml:9: dhcp.pool.start: \"10.0.0.300\" is not an IPv4 address"},
		{minimal + "dhcp: {enabled: maybe}\n", `g.yaml:6: dhcp.enabled: expected true or false, found "maybe"`},
		{minimal + "cluster:\n  clearAfter: soon\n", `g.yaml:7: cluster.clearAfter: expected a duration such as 30s or 5m, found "soon"`},
		{minimal + "enrollment: {maxUnapproved: lots}\n", `g.yaml:6: enrollment.maxUnapproved: expected a whole number, found "lots"`},
		{minimal + "cluster: {podNetwork: {backend: flannel}}\n", `g.yaml:6: cluster.podNetwork.backend: "flannel" is not a pod network backend; use vxlan or host-gw`},
		{minimal + "cluster: {podNetwork: {subnet: 10.244.1.0/16}}\n", `g.yaml:6: cluster.podNetwork.subnet: "10.244.1.0/16" is not a network in CIDR form`},
		{minimal + "logLevel: true\n", "g.yaml:6: logLevel: expected text, found the boolean true; quote it"},
		{minimal + "tftp: &t {dir: x}\nadmin: *t\n", "g.yaml:7: admin: YAML aliases are not supported"},
		{minimal + "policy: {approval: allowlist}\n", "g.yaml:6: policy.allowlist: required"},
		{minimal + "policy: {approval: yes-please}\n", "g.yaml:6: policy.approval"},
		{minimal + "enrollment: {reenroll: sometimes}\n", "g.yaml:6: enrollment.reenroll"},
		{minimal + "enrollment: {identity: tpm2}\n", "g.yaml:6: enrollment.identity"},
		{minimal + "enrollment: {ekRoots: [vendor.pem]}\n", "g.yaml:6: enrollment.ekRoots"},
		{minimal + "selectors: [{name: x, image: nope}]\n", "g.yaml:6: selectors"},
		{strings.Replace(minimal, "advertise: 192.0.2.1\n", "", 1), "g.yaml:1: advertise: required"},
		{strings.Replace(minimal, "racks: [{name: r1}]", "racks: [{name: R_1}]", 1), "g.yaml:5: racks[0].name"},
		{minimal + "listen: {http: 8080}\n", "g.yaml:6: listen.http"},
		{minimal + "interfaces: [{name: eth1}]\n", `g.yaml:6: interfaces: field "interfaces" is given twice; keep one`},
		{"", "g.yaml:1: the file is empty"},
		{"# nothing but a comment\n", "g.yaml:1: the file is empty"},
		{"stateDir: [\n", "g.yaml:"},
		{minimal + "---\nx: 1\n", "g.yaml:6: holds more than one YAML document"},
		{minimal + "metrics:\n  prometheusURL: 127.0.0.1:9090\n", `g.yaml:7: metrics.prometheusURL: "127.0.0.1:9090"`},
		{minimal + "metrics: {prometheusURL: 'ftp://prom:9090'}\n", "g.yaml:6: metrics.prometheusURL: \"ftp://prom:9090\": scheme must be http or https"},
		{minimal + "metrics: {prometheusURL: 'http://u:secret@prom:9090'}\n", "g.yaml:6: metrics.prometheusURL"},
		{minimal + "metrics: {prometheusURL: 'http://prom:9090/?x=1'}\n", "g.yaml:6: metrics.prometheusURL"},
		{minimal + "metrics: {prometheusURL: 'http:///api'}\n", "g.yaml:6: metrics.prometheusURL: \"http:///api\" has no host"},
		{minimal + "metrics: {prometheusUrl: 'http://prom:9090'}\n", `g.yaml:6: metrics.prometheusUrl: unknown field "prometheusUrl"`},
		{minimal + "cluster: {logsEndpoint: 'https://10.0.0.2:9428'}\n", `g.yaml:6: cluster.logsEndpoint: "https://10.0.0.2:9428": give the log gateway as HOST:PORT`},
		{minimal + "cluster: {logsEndpoint: '10.0.0.2'}\n", `g.yaml:6: cluster.logsEndpoint: "10.0.0.2": address 10.0.0.2: missing port in address`},
		{minimal + "cluster: {logsEndpoint: ':9428'}\n", `g.yaml:6: cluster.logsEndpoint: ":9428": give the log gateway`},
		{minimal + "cluster: {logsEndpoint: 'logs:99999'}\n", `g.yaml:6: cluster.logsEndpoint: "logs:99999"`},
		{minimal + "cluster: {registry: 'https://10.0.0.2:5000'}\n", `g.yaml:6: cluster.registry: "https://10.0.0.2:5000": give the cluster registry as HOST:PORT`},
		{minimal + "cluster: {registry: '10.0.0.2'}\n", `g.yaml:6: cluster.registry: "10.0.0.2": address 10.0.0.2: missing port in address`},
		{minimal + "cluster: {registry: ':5000'}\n", `g.yaml:6: cluster.registry: ":5000": give the cluster registry`},
		{minimal + "cluster: {registry: 'registry:0'}\n", `g.yaml:6: cluster.registry: "registry:0"`},
		{minimal + "cluster: {registry: '10.0.0.2:5000/team'}\n", `g.yaml:6: cluster.registry: "10.0.0.2:5000/team"`},
		{minimal + "cluster: {apiServers: ['https://10.0.0.3:6443']}\n", `cluster.apiServers[0]: "https://10.0.0.3:6443": give each API server as HOST:PORT`},
		{minimal + "cluster: {apiServers: ['10.0.0.3:6443', '10.0.0.3:6443']}\n", `cluster.apiServers[1]: "10.0.0.3:6443" is listed twice`},
		{minimal + "inventory: {store: etcd}\n", `g.yaml:6: inventory.store: "etcd": use bbolt`},
		{minimal + "inventory: {store: cluster}\n", "g.yaml:6: inventory.store: cluster needs cluster.kubeconfig"},
	}
	for _, c := range cases {
		_, err := Parse("g.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %q:\nerr = %v\nwant it to contain %q", c.yaml, err, c.want)
		}
	}
}

// All problems come at once, in line order.
func TestErrorsAllAtOnce(t *testing.T) {
	src := "stateDir: /s\nlogLevel: loud\ninterfaces: [{name: eth0}]\nimages: {store: /i, trustedKeys: [/k]}\nracks: [{name: r1}]\ndhcp: {mode: sideways}\n"
	_, err := Parse("g.yaml", []byte(src))
	want := "g.yaml:1: advertise: required: the IP address or host name machines reach gpuboot at\n" +
		"g.yaml:2: logLevel: \"loud\": use debug, info, warn or error\n" +
		"g.yaml:6: dhcp.mode: \"sideways\": use proxy (coexists with the site's DHCP server) or full"
	if err == nil || err.Error() != want {
		t.Fatalf("got:\n%v\nwant:\n%s", err, want)
	}
	// A Config built in code has no lines to give.
	err = (&Config{Source: "built", Listen: Listen{HTTP: ":1", TLS: ":2"}, DHCP: DHCP{Mode: "proxy"},
		Enrollment: Enrollment{UnknownMachines: "hold", Reenroll: "auto"}, Policy: Policy{Approval: "manual"},
		Cluster: Cluster{UnhealthyEffect: "NoSchedule"}, LogLevel: "info"}).Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "built: stateDir: required") {
		t.Fatalf("unparsed Config: %v", err)
	}
}

func TestRelativePaths(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "gpuboot.yaml")
	os.WriteFile(p, []byte(strings.Replace(minimal, "/srv/images", "images", 1)), 0o644)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Images.Store != filepath.Join(dir, "images") {
		t.Fatalf("relative store resolved to %q", c.Images.Store)
	}
}

// enrollment.allowSimulated is off unless the file says true, and a value that is not
// a boolean is an error naming the field.
func TestAllowSimulated(t *testing.T) {
	c, err := Parse("g.yaml", []byte(minimal))
	if err != nil || c.Enrollment.AllowSimulated {
		t.Fatalf("default: allowSimulated %v, %v; want false", c.Enrollment.AllowSimulated, err)
	}
	c, err = Parse("g.yaml", []byte(minimal+"enrollment: {allowSimulated: true}\n"))
	if err != nil || !c.Enrollment.AllowSimulated {
		t.Fatalf("allowSimulated: true parsed as %v, %v", c.Enrollment.AllowSimulated, err)
	}
	_, err = Parse("g.yaml", []byte(minimal+"enrollment: {allowSimulated: sometimes}\n"))
	if err == nil || !strings.Contains(err.Error(), "g.yaml:6") || !strings.Contains(err.Error(), "allowSimulated") {
		t.Fatalf("allowSimulated: sometimes: %v; want an error at g.yaml:6 naming allowSimulated", err)
	}
}

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
	if c.DHCP.Mode != "proxy" || len(c.Interfaces) != 1 || c.Interfaces[0].Name != "eth0" {
		t.Fatalf("example: mode %q interfaces %v, want proxy on eth0", c.DHCP.Mode, c.Interfaces)
	}
	if c.Listen.HTTP != ":8080" || c.Listen.TLS != ":8443" || c.DefaultRack != "r1" || len(c.Selectors) != 2 {
		t.Fatalf("example: %+v", c)
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
	if c.DHCP.Mode != "proxy" || c.Enrollment.UnknownMachines != "discover" || c.Enrollment.Reenroll != "auto" ||
		c.Policy.Approval != "manual" || c.DefaultRack != "r1" || !c.DHCPEnabled() || c.Admin.TokensFile != "/var/lib/gpuboot/operator-tokens" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{minimal + "colour: blue\n", "g.yaml:6: unknown field colour"},
		{minimal + "dhcp: {mode: sideways}\n", "dhcp.mode: \"sideways\""},
		{minimal + "dhcp: {mode: full}\n", "dhcp.pool: required"},
		{minimal + "policy: {approval: allowlist}\n", "policy.allowlist: required"},
		{minimal + "policy: {approval: yes-please}\n", "policy.approval"},
		{minimal + "enrollment: {reenroll: sometimes}\n", "enrollment.reenroll"},
		{minimal + "selectors: [{name: x, image: nope}]\n", "selectors"},
		{strings.Replace(minimal, "advertise: 192.0.2.1\n", "", 1), "advertise: required"},
		{strings.Replace(minimal, "racks: [{name: r1}]", "racks: [{name: R_1}]", 1), "racks[0].name"},
		{minimal + "listen: {http: 8080}\n", "listen.http"},
		{minimal + "interfaces: [{name: eth1}]\n", "mapping key \"interfaces\" already defined"},
		{"", "empty"},
		{minimal + "---\nx: 1\n", "more than one YAML document"},
	}
	for _, c := range cases {
		_, err := Parse("g.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %q:\nerr = %v\nwant it to contain %q", c.yaml, err, c.want)
		}
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

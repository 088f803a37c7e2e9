package components

import (
	"slices"
	"strings"
	"testing"
)

// TestRegistryAuthSpec: the issuer is controlplane-bootstrap's own subcommand on the
// given address, with the registry's serving pair, the signing pair and both
// credential stores, probed on loopback when it listens on every address.
func TestRegistryAuthSpec(t *testing.T) {
	c := RegistryAuthSpec(Layout{Dir: "/cluster"}, "0.0.0.0", 5001)
	want := []string{"registry-auth", "--cert=/cluster/pki/registry.crt", "--key=/cluster/pki/registry.key", "--listen=0.0.0.0:5001",
		"--robots-file=/cluster/registry-auth/tenants.json", "--signing-cert=/cluster/pki/registry-token.crt",
		"--signing-key=/cluster/pki/registry-token.key", "--users-file=/cluster/users/credentials.json"}
	if !slices.Equal(c.Args, want) || !c.Self || c.Name != RegistryAuth || c.HealthURL != "https://127.0.0.1:5001/healthz" {
		t.Errorf("registry-auth: %+v, want args %v", c, want)
	}
	if c := RegistryAuthSpec(Layout{Dir: "/cluster"}, "192.0.2.10", 5001); c.HealthURL != "https://192.0.2.10:5001/healthz" || c.Ports[0].Addr() != "192.0.2.10:5001" {
		t.Errorf("on the advertise address: %+v", c)
	}
	unit := string(RenderUnit(c, "/usr/local/bin/controlplane-bootstrap", "", "/cluster"))
	if !strings.Contains(unit, "ExecStart=/usr/local/bin/controlplane-bootstrap \\\n\tregistry-auth \\\n\t--cert=") {
		t.Errorf("the issuer's unit:\n%s", unit)
	}
}

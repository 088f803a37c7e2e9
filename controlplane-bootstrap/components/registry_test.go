package components

import (
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// TestRegistrySpec: off by default; on, the registry serves its configuration file on
// the advertise address and its metrics on loopback, is healthy on any 200 of "/",
// is restarted by a renewal of its certificate or of the token certificate, and its
// unit may write a storage folder outside the cluster directory.
func TestRegistrySpec(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	if _, ok := Spec(defaultConfig(t, ""), l, Registry); ok {
		t.Fatal("a registry component with the registry off")
	}
	cfg := defaultConfig(t, "apiServer:\n  advertiseAddress: 192.0.2.10\nregistry:\n  enabled: true\n")
	r, ok := Spec(cfg, l, Registry)
	if !ok {
		t.Fatal("no registry component with registry.enabled")
	}
	if !slices.Equal(r.Args, []string{"serve", "/cluster/config/registry.yml"}) || r.HealthURL != "https://192.0.2.10:5000/" || !r.HealthAnyValue {
		t.Errorf("registry: %+v", r)
	}
	if len(r.Ports) != 2 || r.Ports[0].Addr() != "192.0.2.10:5000" || r.Ports[1].Addr() != "127.0.0.1:5002" {
		t.Errorf("ports: %+v", r.Ports)
	}
	specs := Specs(cfg, l)
	if n := len(specs); n < 2 || specs[n-2].Name != Registry || specs[n-1].Name != RegistryAuth || !slices.Contains(AllNames, Registry) || !slices.Contains(AllNames, RegistryAuth) {
		t.Errorf("the registry and its token issuer are not started last, or not known components: %v", AllNames)
	}
	// Both serve with the registry's certificate; both use the signing certificate
	// (the registry trusts it, the issuer signs with its key).
	for _, f := range []string{"/cluster/pki/registry.crt", "/cluster/pki/registry-token.crt"} {
		if got := Using(specs, []string{f}); !slices.Equal(got, []string{Registry, RegistryAuth}) {
			t.Errorf("renewing %s restarts %v, want the registry and its token issuer", f, got)
		}
	}
	if got := RegistryStorage(cfg, l); got != "/cluster/registry" || registryWrites(cfg, l) != nil {
		t.Errorf("default storage %s, writes %v", got, registryWrites(cfg, l))
	}
	unit := string(RenderUnit(r, "/bin/registry", "", l.Dir))
	if !strings.Contains(unit, "\nEnvironment=OTEL_TRACES_EXPORTER=none\n") || !slices.Equal(r.Env, []string{"OTEL_TRACES_EXPORTER=none"}) {
		t.Errorf("the registry's OpenTelemetry exporter is not off: env %v, unit:\n%s", r.Env, unit)
	}
	if !strings.Contains(unit, "ReadWritePaths=/cluster\n") {
		t.Errorf("unit with storage in the cluster directory:\n%s", unit)
	}
	cfg.Registry.Storage = "/srv/images"
	r, _ = Spec(cfg, l, Registry)
	if unit := string(RenderUnit(r, "/bin/registry", "", l.Dir)); !strings.Contains(unit, "ReadWritePaths=/cluster /srv/images\n") {
		t.Errorf("unit with storage elsewhere:\n%s", unit)
	}
}

// TestRegistryConfig: the configuration holds what the registry's contract is
// (docs/contracts.md §17): filesystem storage with deletes on, TLS from the cluster
// CA's certificate, the token issuer's realm, service, issuer and certificate, ES256
// only, the secret, metrics on loopback; read-only only when asked.
func TestRegistryConfig(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	cfg := defaultConfig(t, "apiServer:\n  advertiseAddress: 2001:db8::10\nregistry:\n  enabled: true\n  storage: /srv/images\n  logLevel: warn\n")
	data, err := RegistryConfig(cfg, l, "s3cret", false)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, data)
	}
	for path, want := range map[string]any{
		"version":                              "0.1",
		"log.level":                            "warn",
		"storage.filesystem.rootdirectory":     "/srv/images",
		"storage.delete.enabled":               true,
		"storage.maintenance.readonly.enabled": false,
		"http.addr":                            "[2001:db8::10]:5000",
		"http.secret":                          "s3cret",
		"http.tls.certificate":                 "/cluster/pki/" + clusterpki.RegistryCert,
		"http.tls.key":                         "/cluster/pki/" + clusterpki.RegistryKey,
		"http.debug.addr":                      "127.0.0.1:5002",
		"http.debug.prometheus.enabled":        true,
		"auth.token.realm":                     "https://[2001:db8::10]:5001/token",
		"auth.token.service":                   "gpurack-registry",
		"auth.token.issuer":                    "gpurack-registry-auth",
		"auth.token.rootcertbundle":            "/cluster/pki/registry-token.crt",
		"health.storagedriver.enabled":         true,
	} {
		if v := lookup(got, path); v != want {
			t.Errorf("%s = %v, want %v", path, v, want)
		}
	}
	if algs, _ := lookup(got, "auth.token.signingalgorithms").([]any); len(algs) != 1 || algs[0] != "ES256" {
		t.Errorf("signing algorithms %v, want ES256 alone", algs)
	}
	ro, err := RegistryConfig(cfg, l, "s3cret", true)
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := yaml.Unmarshal(ro, &got); err != nil || lookup(got, "storage.maintenance.readonly.enabled") != true {
		t.Errorf("read-only configuration: %v\n%s", err, ro)
	}
}

// lookup follows a dotted path through nested maps.
func lookup(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

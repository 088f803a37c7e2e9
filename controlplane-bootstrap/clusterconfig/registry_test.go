package clusterconfig

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRegistryDefaults: off unless asked; on, the ports are 5000 (registry), 5001 (its
// token issuer) and 5002 (metrics), storage is left to the cluster directory, and a
// disabled block is not held to its fields.
func TestRegistryDefaults(t *testing.T) {
	cfg, err := Parse("x.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Registry.Enabled {
		t.Error("the registry is on by default")
	}
	if _, err := Parse("x.yaml", []byte("registry:\n  storage: relative\n  logLevel: loud\n")); err != nil {
		t.Errorf("registry off is validated: %v", err)
	}
	cfg, err = Parse("x.yaml", []byte("registry:\n  enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Registry
	if r.Port != 5000 || r.AuthPort != 5001 || r.MetricsPort != 5002 || r.Storage != "" || r.LogLevel != "info" {
		t.Errorf("defaults: %+v", r)
	}
	d := Default()
	if d.Registry.Port != 5000 || d.Registry.AuthPort != 5001 {
		t.Errorf("Default() lacks the registry's ports: %+v", d.Registry)
	}
	cfg, err = Parse("x.yaml", []byte("registry:\n  enabled: true\n  port: 5443\n  storage: /srv/registry\n  certSANs: [registry.example.org, 192.0.2.7]\n  logLevel: debug\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Registry.Port != 5443 || cfg.Registry.Storage != "/srv/registry" || !slices.Contains(cfg.Registry.CertSANs, "192.0.2.7") {
		t.Errorf("given values lost: %+v", cfg.Registry)
	}
}

// Every bad registry input names the file, the line and the field.
func TestRegistryErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "registry:\n  enabled: true\n  prot: 5000\n", []string{"x.yaml:3: registry.prot: unknown field"}},
		{"port not a number", "registry:\n  enabled: true\n  port: five\n", []string{"x.yaml:3: registry.port: expected a whole number"}},
		{"port out of range", "registry:\n  enabled: true\n  port: 70000\n", []string{"x.yaml:3: registry.port: 70000 is not a port"}},
		{"port clash with the apiserver", "registry:\n  enabled: true\n  port: 6443\n", []string{"x.yaml:3: registry.port: 6443 is also apiServer.port"}},
		{"auth port clash", "registry:\n  enabled: true\n  authPort: 5000\n", []string{"x.yaml:3: registry.authPort: 5000 is also registry.port"}},
		{"metrics port clash with logs", "monitoring:\n  enabled: true\nregistry:\n  enabled: true\n  metricsPort: 9429\n", []string{"registry.metricsPort: 9429 is also monitoring.logs.port"}},
		{"relative storage", "registry:\n  enabled: true\n  storage: data/registry\n", []string{"x.yaml:3: registry.storage: \"data/registry\" is not an absolute path"}},
		{"root as storage", "registry:\n  enabled: true\n  storage: /\n", []string{"x.yaml:3: registry.storage"}},
		{"bad SAN", "registry:\n  enabled: true\n  certSANs: [ok.example, \"not a name\"]\n", []string{"registry.certSANs[1]", "neither an IP address nor a DNS name"}},
		{"bad log level", "registry:\n  enabled: true\n  logLevel: verbose\n", []string{"x.yaml:3: registry.logLevel: \"verbose\" is not a log level"}},
		{"enabled not a boolean", "registry:\n  enabled: yes please\n", []string{"x.yaml:2: registry.enabled"}},
		{"list for storage", "registry:\n  enabled: true\n  storage: [a]\n", []string{"x.yaml:3: registry.storage: expected text, found a list"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error for:\n%s", tc.yaml)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// FuzzParseRegistry: whatever the registry block holds, Parse never panics, and what it
// accepts with the registry on has ports, an absolute storage folder (or none) and a
// log level the registry takes.
func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte("registry:\n  enabled: true\n"))
	f.Add([]byte("registry:\n  enabled: true\n  port: 5443\n  authPort: 5444\n  storage: /srv/r\n  certSANs: [r.example, 10.0.0.1]\n"))
	f.Add([]byte("registry: {enabled: true, storage: \"/\", logLevel: debug}\n"))
	f.Add([]byte("registry:\n  enabled: true\n  metricsPort: 6443\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if err != nil || !cfg.Registry.Enabled {
			return
		}
		r := cfg.Registry
		for _, p := range []int{r.Port, r.AuthPort, r.MetricsPort} {
			if p < 1 || p > 65535 {
				t.Fatalf("accepted port %d: %+v", p, r)
			}
		}
		if r.Storage != "" && (!filepath.IsAbs(r.Storage) || filepath.Clean(r.Storage) == "/") {
			t.Fatalf("accepted storage %q", r.Storage)
		}
		if !registryLogLevel.MatchString(r.LogLevel) {
			t.Fatalf("accepted log level %q", r.LogLevel)
		}
	})
}

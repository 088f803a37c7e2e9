package components

import (
	"fmt"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
)

// The image registry (cluster.yaml's registry; docs/registry.md, decision 0697): CNCF
// distribution's registry, also its pinned binary's name (`make k8s-bins`).
const (
	Registry = "registry"
	// RegistryService is the service the registry's tokens are for (their aud, the
	// challenge's service); RegistryIssuer is their iss, the token issuer's name.
	// Package registryauth, which issues them, owns both.
	RegistryService = registryauth.Service
	RegistryIssuer  = registryauth.Issuer
	// RegistryTokenCert is the token issuer's self-signed signing certificate, under
	// DIR/pki: the registry trusts the tokens whose x5c chain ends in it
	// (registryauth.EnsureSigningKey writes it at init).
	RegistryTokenCert = registryauth.SigningCertFile
	// RegistryHTTPSecret is the random secret, under DIR/pki, the registry signs its
	// upload state with.
	RegistryHTTPSecret = "registry-http.secret"
)

// RegistryConfigFile is the registry's configuration, DIR/config/registry.yml.
func (l Layout) RegistryConfigFile() string { return filepath.Join(l.Dir, "config", "registry.yml") }

// RegistryStorage is the folder that holds the images: registry.storage, or
// DIR/registry.
func RegistryStorage(cfg *clusterconfig.Config, l Layout) string {
	if cfg.Registry.Storage != "" {
		return filepath.Clean(cfg.Registry.Storage)
	}
	return filepath.Join(l.Dir, "registry")
}

// RegistryURL is the registry's base URL on the advertise address.
func RegistryURL(cfg *clusterconfig.Config) string {
	return "https://" + hostPort(cfg.APIServer.AdvertiseAddress, cfg.Registry.Port)
}

// RegistryRealm is where clients get tokens: the token issuer's /token.
func RegistryRealm(cfg *clusterconfig.Config) string {
	return "https://" + hostPort(cfg.APIServer.AdvertiseAddress, cfg.Registry.AuthPort) + "/token"
}

// RegistryMetricsAddr is where the registry serves its Prometheus metrics (/metrics):
// loopback only, with its debug endpoints (pprof, expvar).
func RegistryMetricsAddr(cfg *clusterconfig.Config) string {
	return hostPort("127.0.0.1", cfg.Registry.MetricsPort)
}

func registrySpecs(cfg *clusterconfig.Config, l Layout) []Component {
	if !cfg.Registry.Enabled {
		return nil
	}
	r := cfg.Registry
	adv := cfg.APIServer.AdvertiseAddress
	return []Component{{
		Name: Registry,
		Args: []string{"serve", l.RegistryConfigFile()},
		// distribution exports OpenTelemetry traces to localhost:4318 unless told
		// otherwise (and logs an error every few seconds when nothing listens there).
		Env: []string{"OTEL_TRACES_EXPORTER=none"},
		Ports: []Port{
			{adv, r.Port, "registry.port"},
			{"127.0.0.1", r.MetricsPort, "registry.metricsPort"},
		},
		// "/" answers 200 with no body once the TLS listener serves, and 503 while the
		// storage health check fails.
		HealthURL:      RegistryURL(cfg) + "/",
		HealthAnyValue: true,
		// Named in its configuration file, not in flags: `certs renew registry`
		// restarts it (Using).
		Reads:  []string{l.PKI(clusterpki.RegistryCert), l.PKI(clusterpki.RegistryKey), l.PKI(RegistryTokenCert)},
		Writes: registryWrites(cfg, l),
	}, RegistryAuthSpec(l, adv, r.AuthPort)}
}

// registryWrites is registry.storage when it is outside the cluster directory.
func registryWrites(cfg *clusterconfig.Config, l Layout) []string {
	s := RegistryStorage(cfg, l)
	if rel, err := filepath.Rel(l.Dir, s); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return nil
	}
	return []string{s}
}

// registryConfig is distribution's configuration (version 0.1), the parts gpurack sets.
// https://distribution.github.io/distribution/about/configuration/
type registryConfig struct {
	Version string         `yaml:"version"`
	Log     registryLog    `yaml:"log"`
	Storage map[string]any `yaml:"storage"`
	HTTP    registryHTTP   `yaml:"http"`
	Auth    map[string]any `yaml:"auth"`
	Health  map[string]any `yaml:"health"`
}

type registryLog struct {
	Level     string         `yaml:"level"`
	Formatter string         `yaml:"formatter"`
	AccessLog map[string]any `yaml:"accesslog"`
}

type registryHTTP struct {
	Addr    string              `yaml:"addr"`
	Net     string              `yaml:"net"`
	Secret  string              `yaml:"secret"`
	TLS     map[string]any      `yaml:"tls"`
	Debug   map[string]any      `yaml:"debug"`
	Headers map[string][]string `yaml:"headers"`
}

// RegistryConfig renders DIR/config/registry.yml for cfg: filesystem storage with
// deletes on (for garbage collection), TLS with pki/registry.crt, bearer tokens of the
// token issuer only (signed ES256 by the key of pki/registry-token.crt), the upload
// state signed with secret, its log on its output at registry.logLevel, and its metrics
// on loopback. readOnly puts it in maintenance read-only mode, in which pushes and
// deletes are refused and pulls go on: `registry gc` runs it so while it collects.
func RegistryConfig(cfg *clusterconfig.Config, l Layout, secret string, readOnly bool) ([]byte, error) {
	r := cfg.Registry
	c := registryConfig{
		Version: "0.1",
		Log:     registryLog{Level: r.LogLevel, Formatter: "text", AccessLog: map[string]any{"disabled": false}},
		Storage: map[string]any{
			"filesystem": map[string]any{"rootdirectory": RegistryStorage(cfg, l)},
			"delete":     map[string]any{"enabled": true},
			"maintenance": map[string]any{
				// Uploads left unfinished for a week are removed, once a day.
				"uploadpurging": map[string]any{"enabled": true, "age": "168h", "interval": "24h", "dryrun": false},
				"readonly":      map[string]any{"enabled": readOnly},
			},
		},
		HTTP: registryHTTP{
			Addr:   hostPort(cfg.APIServer.AdvertiseAddress, r.Port),
			Net:    "tcp",
			Secret: secret,
			TLS: map[string]any{
				"certificate": l.PKI(clusterpki.RegistryCert),
				"key":         l.PKI(clusterpki.RegistryKey),
				"minimumtls":  "tls1.2",
			},
			Debug: map[string]any{
				"addr":       RegistryMetricsAddr(cfg),
				"prometheus": map[string]any{"enabled": true, "path": "/metrics"},
			},
			Headers: map[string][]string{"X-Content-Type-Options": {"nosniff"}},
		},
		Auth: map[string]any{"token": map[string]any{
			"realm":             RegistryRealm(cfg),
			"service":           RegistryService,
			"issuer":            RegistryIssuer,
			"rootcertbundle":    l.PKI(RegistryTokenCert),
			"signingalgorithms": []string{"ES256"},
		}},
		Health: map[string]any{"storagedriver": map[string]any{"enabled": true, "interval": "10s", "threshold": 3}},
	}
	body, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", l.RegistryConfigFile(), err)
	}
	head := "# Written by controlplane-bootstrap from cluster.yaml's registry block; init and `registry gc` rewrite it.\n" +
		"# It holds the registry's HTTP secret: mode 0600.\n"
	if readOnly {
		head += "# Read-only while `controlplane-bootstrap registry gc` runs (maintenance.readonly); gc turns it back.\n"
	}
	return append([]byte(head), body...), nil
}

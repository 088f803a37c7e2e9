package clusterconfig

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
)

// Registry configures the cluster's image registry, CNCF distribution's registry, which
// init runs beside the control-plane components when Enabled (docs/registry.md;
// docs/decisions/0697-registry.md). It serves the distribution (OCI) API over TLS with
// pki/registry.crt on the advertise address, and accepts only bearer tokens signed by
// the registry's token issuer (the registry-auth component, on AuthPort).
type Registry struct {
	// Enabled starts the registry. Off by default: it needs `make k8s-bins`' registry
	// binary and the token issuer's signing certificate (pki/registry-token.crt).
	Enabled bool `yaml:"enabled"`
	// Port is the registry's TLS port on apiServer.advertiseAddress; default 5000.
	Port int `yaml:"port"`
	// AuthPort is the token issuer's TLS port on the same address, the realm clients
	// are sent to (https://ADDRESS:AUTHPORT/token); default 5001.
	AuthPort int `yaml:"authPort"`
	// MetricsPort serves the registry's Prometheus metrics (/metrics) and its debug
	// endpoints on 127.0.0.1 only; default 5002.
	MetricsPort int `yaml:"metricsPort"`
	// Storage is the folder that holds the images (the filesystem driver's root), an
	// absolute path on this host's persistent disk; empty: DIR/registry.
	Storage string `yaml:"storage"`
	// CertSANs are extra DNS names or IPs for pki/registry.crt, for clients that reach
	// the registry by another name (a DNS name of the site's); the advertise address
	// and gpurack-registry are always in it.
	CertSANs []string `yaml:"certSANs"`
	// LogLevel is the registry's log level: error, warn, info (default) or debug.
	LogLevel string `yaml:"logLevel"`
}

func defaultRegistry() Registry {
	return Registry{Port: 5000, AuthPort: 5001, MetricsPort: 5002, LogLevel: "info"}
}

func (r *Registry) applyDefaults() {
	d := defaultRegistry()
	for _, f := range []struct {
		p *int
		v int
	}{
		{&r.Port, d.Port}, {&r.AuthPort, d.AuthPort}, {&r.MetricsPort, d.MetricsPort},
	} {
		if *f.p == 0 {
			*f.p = f.v
		}
	}
	if r.LogLevel == "" {
		r.LogLevel = d.LogLevel
	}
}

// registryLogLevel is what distribution's log.level takes (logrus' levels, the useful
// ones).
var registryLogLevel = regexp.MustCompile(`^(error|warn|info|debug)$`)

// validate checks registry when it runs; its ports are validatePorts'.
func (r *Registry) validate(p *problems) {
	if !r.Enabled {
		return
	}
	if r.Storage != "" && (!filepath.IsAbs(r.Storage) || filepath.Clean(r.Storage) == "/") {
		p.add("registry.storage", "%q is not an absolute path of a folder (leave it empty for the registry folder in the cluster directory)", r.Storage)
	}
	for i, san := range r.CertSANs {
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if !dnsName.MatchString(san) || len(san) > 253 {
			p.add(fmt.Sprintf("registry.certSANs[%d]", i), "%q is neither an IP address nor a DNS name", san)
		}
	}
	if !registryLogLevel.MatchString(r.LogLevel) {
		p.add("registry.logLevel", "%q is not a log level: write error, warn, info or debug", r.LogLevel)
	}
}

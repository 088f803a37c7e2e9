// Package nodeexporter runs node_exporter on a node with the scrape credential
// (decision 0693): the image ships /usr/bin/node_exporter and node-exporter.service,
// not enabled; once the node has joined, gpuagent writes node_exporter's web
// configuration (exporter-toolkit's --web.config.file: TLS with a serving certificate
// the agent makes, a client certificate signed by the cluster CA required, and only
// the metrics server's SAN allowed) and starts or restarts the unit.
//
// The unit runs node_exporter as a dynamic user, which cannot read the agent's
// runtime directory (0700): systemd hands it the files with LoadCredential, so the web
// configuration names them relative to itself (exporter-toolkit resolves them
// against the file's directory). The unit's text is imagebuilder/rootfs's.
//
// It is not node_exporter's collectors (their flags are the unit's) nor gpuagent's own
// /metrics (agent/metricsauth).
package nodeexporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// Unit is the unit the image ships, not enabled.
const Unit = "node-exporter.service"

// DefaultDir is where the agent writes the files the unit loads as credentials (under
// gpuagent's RuntimeDirectory, /run/gpurack).
const DefaultDir = "/run/gpurack/node-exporter"

// DefaultListen is node_exporter's address on every node.
const DefaultListen = ":9100"

// The files under the directory: the unit's LoadCredential lines name each of them.
const (
	WebConfigFile = "web.yml"
	CertFile      = "tls.crt"
	KeyFile       = "tls.key"
	ClientCAFile  = "client-ca.crt"
	// EnvFile sets LISTEN, node_exporter's --web.listen-address (the unit's
	// EnvironmentFile).
	EnvFile = "env"
)

// WebConfig is the part of exporter-toolkit's web configuration file gpurack writes.
type WebConfig struct {
	TLSServerConfig TLSServerConfig `json:"tls_server_config"`
}

// TLSServerConfig is exporter-toolkit's tls_server_config.
type TLSServerConfig struct {
	CertFile       string `json:"cert_file"`
	KeyFile        string `json:"key_file"`
	ClientAuthType string `json:"client_auth_type"`
	ClientCAFile   string `json:"client_ca_file"`
	// ClientAllowedSANs, when set, admits only a client certificate that carries one
	// of them (a DNS name, email, IP address or URI SAN).
	ClientAllowedSANs []string `json:"client_allowed_sans,omitempty"`
	MinVersion        string   `json:"min_version"`
}

// RenderWebConfig is the web configuration: the serving certificate and key, a client
// certificate signed by the cluster CA required, and, when allowedSANs is not empty,
// one of those SANs in it. File names are relative to the configuration's directory.
func RenderWebConfig(allowedSANs []string) ([]byte, error) {
	for _, s := range allowedSANs {
		if strings.TrimSpace(s) == "" || strings.ContainsAny(s, "\n\r") {
			return nil, fmt.Errorf("node_exporter web config: allowed SAN %q is empty or spans lines", s)
		}
	}
	return yaml.Marshal(WebConfig{TLSServerConfig: TLSServerConfig{
		CertFile: CertFile, KeyFile: KeyFile, ClientAuthType: "RequireAndVerifyClientCert",
		ClientCAFile: ClientCAFile, ClientAllowedSANs: allowedSANs, MinVersion: "TLS12"}})
}

// Files is what Write lays out.
type Files struct {
	// ClusterCAPEM is the CA a scraper's client certificate must chain to.
	ClusterCAPEM []byte
	// Serving is node_exporter's serving certificate and key.
	Serving *pki.KeyPair
	// AllowedSANs restricts the clients (RenderWebConfig); empty: any certificate the
	// cluster CA signed.
	AllowedSANs []string
	// Listen is node_exporter's address; empty: DefaultListen.
	Listen string
}

// Write writes the web configuration, the serving certificate and key (the key 0600),
// the client CA and the unit's environment file into dir, each replaced atomically.
func Write(dir string, f Files) error {
	if len(f.ClusterCAPEM) == 0 || f.Serving == nil {
		return errors.New("node_exporter files: need the cluster CA and a serving certificate")
	}
	if _, err := pki.DecodeCertsPEM(f.ClusterCAPEM); err != nil {
		return fmt.Errorf("node_exporter files: cluster CA: %w", err)
	}
	listen := f.Listen
	if listen == "" {
		listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(listen); err != nil || strings.ContainsAny(listen, " \n\"'\\$") {
		return fmt.Errorf("node_exporter listen address %q: want HOST:PORT or :PORT", listen)
	}
	web, err := RenderWebConfig(f.AllowedSANs)
	if err != nil {
		return err
	}
	key, err := pki.EncodeKeyPEM(f.Serving.Key)
	if err != nil {
		return fmt.Errorf("node_exporter files: %w", err)
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{ClientCAFile, f.ClusterCAPEM, 0o644},
		{CertFile, pki.EncodeCertPEM(f.Serving.Cert), 0o644},
		{KeyFile, key, 0o600},
		{WebConfigFile, web, 0o644},
		{EnvFile, []byte("LISTEN=" + listen + "\n"), 0o644},
	}
	for _, file := range files {
		if err := atomicfile.WriteMkdirAll(filepath.Join(dir, file.name), file.data, file.mode, 0o700); err != nil {
			return fmt.Errorf("node_exporter files: %w", err)
		}
	}
	return nil
}

// Restarter restarts a systemd unit (starts it when it is not running) and waits for
// the job; kubejoin.SystemdHost is one.
type Restarter interface {
	RestartUnit(ctx context.Context, unit string) error
}

// Start restarts Unit, so that it loads the files Write just wrote.
func Start(ctx context.Context, r Restarter) error {
	if err := r.RestartUnit(ctx, Unit); err != nil {
		return fmt.Errorf("restart %s: %w", Unit, err)
	}
	return nil
}

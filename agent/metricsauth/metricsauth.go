// Package metricsauth is the scrape credential on a node's metrics endpoints
// (decision 0693): gpuagent's /metrics is served over TLS with a serving certificate the
// agent makes at start, and answers only a client whose certificate the cluster CA
// signed and whose CommonName is an allowed one (the metrics server's,
// gpurack:monitoring). node_exporter gets the same credential through its own web
// configuration (agent/nodeexporter).
//
// It is not the metrics themselves (agent/server's Collector) nor the Kubernetes RBAC
// that lets the same identity read kubelet's metrics.
package metricsauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// MonitoringCN is the CommonName of the metrics server's scrape certificate
// (controlplane-bootstrap's pki/monitoring-client.crt), the one identity allowed by
// default.
const MonitoringCN = "gpurack:monitoring"

// MonitoringSAN is the DNS name in the same certificate's subject alternative names:
// node_exporter's web configuration can restrict clients by SAN only
// (client_allowed_sans), not by CommonName.
const MonitoringSAN = "gpurack-monitoring"

// ErrNoCA is a scrape before the agent knows the cluster CA: before the join, without
// --metrics-client-ca.
var ErrNoCA = errors.New("no cluster CA yet: gpuagent refuses every scrape until the join brings the cluster CA (labs without a join: pass --metrics-client-ca FILE)")

// Gate decides which client certificates may scrape. The zero Gate refuses everyone;
// SetCA arms it. It is safe for concurrent use.
type Gate struct {
	// CNs are the CommonNames allowed; empty: MonitoringCN alone.
	CNs []string
	ca  atomic.Pointer[x509.CertPool]
}

// SetCA sets the CA a client certificate must chain to, from PEM (one or more
// certificates).
func (g *Gate) SetCA(pemData []byte) error {
	certs, err := pki.DecodeCertsPEM(pemData)
	if err != nil {
		return fmt.Errorf("metrics client CA: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		if !c.IsCA {
			return fmt.Errorf("metrics client CA: certificate %q is not a CA certificate", c.Subject.CommonName)
		}
		pool.AddCert(c)
	}
	g.ca.Store(pool)
	return nil
}

// Armed reports whether SetCA has been called.
func (g *Gate) Armed() bool { return g.ca.Load() != nil }

// allowed are the CommonNames let through.
func (g *Gate) allowed() []string {
	if len(g.CNs) == 0 {
		return []string{MonitoringCN}
	}
	return g.CNs
}

// Verify checks a client's certificate chain as the TLS handshake gives it (leaf
// first): signed by the CA, for client authentication, valid now, with an allowed
// CommonName. Its error says which, and is the handshake's.
func (g *Gate) Verify(rawCerts [][]byte) error {
	pool := g.ca.Load()
	if pool == nil {
		return ErrNoCA
	}
	if len(rawCerts) == 0 {
		return errors.New("metrics: the client sent no certificate (scrape with the metrics server's certificate, pki/monitoring-client.crt)")
	}
	certs := make([]*x509.Certificate, 0, len(rawCerts))
	for _, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return fmt.Errorf("metrics: client certificate: %w", err)
		}
		certs = append(certs, c)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: time.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("metrics: client certificate %q not signed by the cluster CA: %w", leaf.Subject.CommonName, err)
	}
	for _, cn := range g.allowed() {
		if leaf.Subject.CommonName == cn {
			return nil
		}
	}
	return fmt.Errorf("metrics: client certificate CN %q may not scrape (allowed: %s; gpuagent --metrics-client-cn)",
		leaf.Subject.CommonName, strings.Join(g.allowed(), ", "))
}

// ServerTLS is the TLS configuration of a metrics endpoint serving cert: every client
// must present a certificate, which Verify checks.
func (g *Gate) ServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			return g.Verify(rawCerts)
		},
	}
}

// ServingCert makes a serving certificate for names and ips, signed by a CA made for
// it alone whose key is then dropped: as kubelet's own serving certificate, nothing
// verifies it (the metrics server scrapes with insecure_skip_verify; what it protects
// is the scrape's confidentiality and the client's authentication, not the server's
// identity). It is valid for validity (zero: pki.DefaultLeafValidity).
func ServingCert(commonName string, names []string, ips []net.IP, validity time.Duration) (*pki.KeyPair, error) {
	if validity == 0 {
		validity = pki.DefaultLeafValidity
	}
	ca, err := pki.NewCA(pki.CARequest{CommonName: commonName + " metrics serving CA (throwaway)", Validity: validity + time.Hour})
	if err != nil {
		return nil, err
	}
	if len(names) == 0 && len(ips) == 0 {
		names = []string{"localhost"}
	}
	return ca.Issue(pki.CertRequest{CommonName: commonName, DNSNames: names, IPs: ips, Usages: []pki.Usage{pki.ServerAuth}, Validity: validity})
}

// ParseCNs splits a comma-separated list of CommonNames (a flag's value), trimming
// spaces and dropping empty ones.
func ParseCNs(s string) []string {
	var out []string
	for _, cn := range strings.Split(s, ",") {
		if cn = strings.TrimSpace(cn); cn != "" {
			out = append(out, cn)
		}
	}
	return out
}

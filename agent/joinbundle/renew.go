package joinbundle

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// Current is the agent certificate in use: the one Renew installed last, else Cert.
func (c *Credentials) Current() *x509.Certificate {
	if r := c.renewed.Load(); r != nil {
		return r
	}
	return c.Cert
}

// TLSCertificate is the current agent certificate with its key, for a TLS handshake.
func (c *Credentials) TLSCertificate() *tls.Certificate {
	cur := c.Current()
	return &tls.Certificate{Certificate: [][]byte{cur.Raw}, PrivateKey: c.Key, Leaf: cur}
}

// GetCertificate is tls.Config.GetCertificate for the agent's mutual-TLS API: every new
// connection gets the current certificate, so a renewal needs no restart.
func (c *Credentials) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.TLSCertificate(), nil
}

// GetClientCertificate is tls.Config.GetClientCertificate for the agent's calls to
// gpuboot: the current certificate while it is valid. An expired one is not sent (an
// empty answer): gpuboot would refuse the handshake, and the agent's calls then carry
// RequestAuth signed by its key, with which it renews (CONTRACTS §2.10).
func (c *Credentials) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if !c.Valid(time.Now()) {
		return &tls.Certificate{}, nil
	}
	return c.TLSCertificate(), nil
}

// Valid reports whether the current certificate is within its validity period at now.
func (c *Credentials) Valid(now time.Time) bool {
	cur := c.Current()
	return !now.Before(cur.NotBefore) && !now.After(cur.NotAfter)
}

// Renew installs a renewed agent certificate (PEM, RenewAgentCertificateResponse)
// after checking that it is for the agent's key and node name and chains to the
// gpurack CA; new TLS connections use it from then on. It returns the certificate.
func (c *Credentials) Renew(certPEM []byte) (*x509.Certificate, error) {
	cert, err := pki.DecodeCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("renewed agent certificate: %w", err)
	}
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(c.Key.Public()) {
		return nil, fmt.Errorf("renewed agent certificate (serial %s) does not hold the agent's public key", cert.SerialNumber.Text(16))
	}
	if want := c.Current().Subject.CommonName; cert.Subject.CommonName != want {
		return nil, fmt.Errorf("renewed agent certificate is for node %q, this agent is %q", cert.Subject.CommonName, want)
	}
	if pki.RoleOf(cert) != pki.RoleAgents {
		return nil, fmt.Errorf("renewed agent certificate has role %q, not %s", pki.RoleOf(cert), pki.RoleAgents)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool(c.CA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("renewed agent certificate is not issued by the gpurack CA: %w", err)
	}
	c.renewed.Store(cert)
	return cert, nil
}

// KeepRenewed stores b, with cert in place of its agent certificate, as the kept bundle
// in keyDir (Keep), so that an agent restarted by systemd uses the renewed certificate.
// b itself is not changed.
func KeepRenewed(b *bootv1.JoinBundle, cert *x509.Certificate, keyDir string) error {
	kept := proto.CloneOf(b)
	kept.AgentCertificatePem = string(pki.EncodeCertPEM(cert))
	if err := Keep(kept, keyDir); err != nil {
		return fmt.Errorf("keep the renewed agent certificate in %s: %w", filepath.Join(keyDir, KeptFile), err)
	}
	return nil
}

package pki

import (
	"crypto"
	"crypto/x509"
	"net"
	"time"
)

// CertifyAgentFor is CertifyAgent with the certificate valid for validity from now
// (zero: DefaultLeafValidity): gpuboot's enrollment.agentCertValidity, for the
// JoinBundle and for each renewal.
func CertifyAgentFor(ca *CA, nodeName string, ips []net.IP, pub crypto.PublicKey, validity time.Duration) (*x509.Certificate, error) {
	req, err := agentRequest(nodeName, ips)
	if err != nil {
		return nil, err
	}
	req.Validity = validity
	return ca.Certify(req, pub)
}

// Issued is when cert was issued: its NotBefore plus Backdate (Issue and Certify
// backdate every certificate so that a lagging clock accepts it), never after NotAfter.
// A certificate this package did not issue reads as issued a little late, which only
// renews it a little late.
func Issued(cert *x509.Certificate) time.Time {
	t := cert.NotBefore.Add(Backdate)
	if t.After(cert.NotAfter) {
		return cert.NotAfter
	}
	return t
}

// Lifetime is how long cert is valid from Issued to NotAfter.
func Lifetime(cert *x509.Certificate) time.Duration { return cert.NotAfter.Sub(Issued(cert)) }

// RenewAt is when cert is due for renewal: once fraction (0 to 1) of its Lifetime has
// passed. Agents renew at two thirds (CONTRACTS §2.10).
func RenewAt(cert *x509.Certificate, fraction float64) time.Time {
	return Issued(cert).Add(time.Duration(float64(Lifetime(cert)) * fraction))
}

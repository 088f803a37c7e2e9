package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Validity defaults and the clock-skew allowance applied to every certificate.
const (
	// DefaultCAValidity is how long a CA made by NewCA is valid when the
	// request leaves Validity at zero.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// DefaultLeafValidity is how long a certificate issued by CA.Issue or
	// CA.Certify (and so by IssueServer, IssueAgent, CertifyAgent and
	// IssueOperator) is valid when the request leaves Validity at zero. It
	// never outlives the CA.
	DefaultLeafValidity = 365 * 24 * time.Hour
	// Backdate is subtracted from NotBefore so that a machine whose clock
	// lags the issuer's by a few minutes (a node before time sync) still
	// accepts a certificate that was just issued.
	Backdate = 5 * time.Minute
)

// CA is a certificate authority: its self-signed certificate and the key
// that signs the certificates it issues.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// KeyPair is an issued certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CARequest describes a CA to create with NewCA.
type CARequest struct {
	// CommonName is the subject CN, for example "gpurack CA". Required.
	CommonName string
	// Organizations is the subject O, optional.
	Organizations []string
	// Validity is how long the CA is valid from NotBefore; zero means
	// DefaultCAValidity.
	Validity time.Duration
	// NotBefore is the start of validity before Backdate is applied; zero
	// means now.
	NotBefore time.Time
}

// Usage is an extended key usage a leaf certificate is issued for.
type Usage int

// The usages gpurack issues certificates for.
const (
	// ServerAuth lets the holder serve TLS (x509.ExtKeyUsageServerAuth).
	ServerAuth Usage = iota + 1
	// ClientAuth lets the holder authenticate as a TLS client
	// (x509.ExtKeyUsageClientAuth).
	ClientAuth
)

func (u Usage) String() string {
	switch u {
	case ServerAuth:
		return "serverAuth"
	case ClientAuth:
		return "clientAuth"
	}
	return fmt.Sprintf("Usage(%d)", int(u))
}

func (u Usage) extKeyUsage() (x509.ExtKeyUsage, error) {
	switch u {
	case ServerAuth:
		return x509.ExtKeyUsageServerAuth, nil
	case ClientAuth:
		return x509.ExtKeyUsageClientAuth, nil
	}
	return 0, fmt.Errorf("unknown usage %d: use pki.ServerAuth or pki.ClientAuth", int(u))
}

// CertRequest describes a leaf certificate to issue with CA.Issue.
type CertRequest struct {
	// CommonName is the subject CN. Required.
	CommonName string
	// Organizations is the subject O; gpurack puts the role here (see Role).
	Organizations []string
	// OrganizationalUnits is the subject OU; an operator certificate's level goes here
	// (see OperatorLevel).
	OrganizationalUnits []string
	// DNSNames and IPs are the subject alternative names. A certificate
	// with ServerAuth needs at least one of them.
	DNSNames []string
	IPs      []net.IP
	// Usages lists what the certificate may be used for; at least one.
	Usages []Usage
	// Validity is how long the certificate is valid from NotBefore; zero
	// means DefaultLeafValidity. NotAfter is capped at the CA's NotAfter.
	Validity time.Duration
	// NotBefore is the start of validity before Backdate is applied; zero
	// means now.
	NotBefore time.Time
}

// NewCA creates a self-signed CA with a fresh ECDSA P-256 key and a random
// 128-bit serial number. The CA signs certificates only (no intermediates:
// path length zero).
func NewCA(req CARequest) (*CA, error) {
	if req.CommonName == "" {
		return nil, errors.New("new CA: CommonName is required")
	}
	if req.Validity < 0 {
		return nil, fmt.Errorf("new CA %q: Validity %v is negative", req.CommonName, req.Validity)
	}
	validity := req.Validity
	if validity == 0 {
		validity = DefaultCAValidity
	}
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("new CA %q: %w", req.CommonName, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new CA %q: %w", req.CommonName, err)
	}
	start := startOf(req.NotBefore)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.CommonName, Organization: req.Organizations},
		NotBefore:             start,
		NotAfter:              start.Add(Backdate + validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("new CA %q: %w", req.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new CA %q: parse the certificate just created: %w", req.CommonName, err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue signs a new leaf certificate for req with a fresh ECDSA P-256 key.
func (ca *CA) Issue(req CertRequest) (*KeyPair, error) {
	if err := ca.check(); err != nil {
		return nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("issue certificate %q: %v", req.CommonName, err)
	}
	cert, err := ca.Certify(req, key.Public())
	if err != nil {
		return nil, err
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// Certify signs a leaf certificate for req over pub, a public key whose private half
// stays with its holder: an agent's ed25519 key, which never travels (CONTRACTS §4).
// pub is an *ecdsa.PublicKey or an ed25519.PublicKey. The certificate is the one Issue
// makes for the same request, with pub as its key.
func (ca *CA) Certify(req CertRequest, pub crypto.PublicKey) (*x509.Certificate, error) {
	if err := ca.check(); err != nil {
		return nil, err
	}
	if req.CommonName == "" {
		return nil, errors.New("issue certificate: CommonName is required")
	}
	fail := func(format string, args ...any) (*x509.Certificate, error) {
		return nil, fmt.Errorf("issue certificate %q: %s", req.CommonName, fmt.Sprintf(format, args...))
	}
	switch k := pub.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return fail("ed25519 public key of %d bytes, want %d", len(k), ed25519.PublicKeySize)
		}
	case *ecdsa.PublicKey:
		if k == nil {
			return fail("no public key")
		}
	case nil:
		return fail("no public key")
	default:
		return fail("public key of type %T: give an ed25519 or ECDSA key", pub)
	}
	if len(req.Usages) == 0 {
		return fail("no usages: give pki.ServerAuth and/or pki.ClientAuth")
	}
	var ext []x509.ExtKeyUsage
	server := false
	for _, u := range req.Usages {
		e, err := u.extKeyUsage()
		if err != nil {
			return fail("%v", err)
		}
		server = server || u == ServerAuth
		ext = append(ext, e)
	}
	if server && len(req.DNSNames) == 0 && len(req.IPs) == 0 {
		return fail("a serverAuth certificate needs at least one DNS name or IP address for clients to check")
	}
	for _, ip := range req.IPs {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return fail("invalid IP address %v", ip)
		}
	}
	if req.Validity < 0 {
		return fail("Validity %v is negative", req.Validity)
	}
	validity := req.Validity
	if validity == 0 {
		validity = DefaultLeafValidity
	}
	serial, err := randomSerial()
	if err != nil {
		return fail("%v", err)
	}
	start := startOf(req.NotBefore)
	end := start.Add(Backdate + validity)
	if end.After(ca.Cert.NotAfter) {
		end = ca.Cert.NotAfter
	}
	if !end.After(start) {
		return fail("the CA %q expired on %s: create a new CA", ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.RFC3339))
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.CommonName, Organization: req.Organizations, OrganizationalUnit: req.OrganizationalUnits},
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPs,
		NotBefore:             start,
		NotAfter:              end,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           ext,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return fail("%v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return fail("parse the certificate just created: %v", err)
	}
	return cert, nil
}

// Pin returns the CA certificate's pin, see SPKIPin.
func (ca *CA) Pin() string { return SPKIPin(ca.Cert) }

// CertPool returns a pool holding only the CA certificate, for
// tls.Config.RootCAs or ClientCAs.
func (ca *CA) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// TLSCertificate returns kp as a tls.Certificate whose chain is the leaf
// followed by chain (pass the CA certificate so that a client which pins the
// CA, as the agent does, finds it in the handshake).
func (kp *KeyPair) TLSCertificate(chain ...*x509.Certificate) tls.Certificate {
	c := tls.Certificate{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}
	for _, ch := range chain {
		c.Certificate = append(c.Certificate, ch.Raw)
	}
	return c
}

func (ca *CA) check() error {
	if ca == nil || ca.Cert == nil || ca.Key == nil {
		return errors.New("issue certificate: the CA has no certificate or no key")
	}
	if !ca.Cert.IsCA {
		return fmt.Errorf("issue certificate: %q is not a CA certificate", ca.Cert.Subject.CommonName)
	}
	return keyMatchesCert(ca.Key, ca.Cert)
}

// keyMatchesCert reports an error unless key is the private half of the
// public key in cert.
func keyMatchesCert(key crypto.Signer, cert *x509.Certificate) error {
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("private key: %w", err)
	}
	if !bytes.Equal(pub, cert.RawSubjectPublicKeyInfo) {
		return fmt.Errorf("the private key does not belong to certificate %q (serial %s)",
			cert.Subject.CommonName, cert.SerialNumber.Text(16))
	}
	return nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECDSA P-256 key: %w", err)
	}
	return key, nil
}

var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

// randomSerial returns a random positive serial number below 2^128
// (RFC 5280 §4.1.2.2: positive, at most 20 octets).
func randomSerial() (*big.Int, error) {
	for {
		n, err := rand.Int(rand.Reader, serialLimit)
		if err != nil {
			return nil, fmt.Errorf("random serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func startOf(t time.Time) time.Time {
	if t.IsZero() {
		t = time.Now()
	}
	return t.Add(-Backdate).UTC().Truncate(time.Second)
}

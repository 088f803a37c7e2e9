package pki

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

const pinPrefix = "sha256:"

// SPKIPin returns cert's public key pin in kubeadm's format (docs/contracts.md
// §3, the value of gpurack.enroll.ca): "sha256:" followed by the lowercase
// hex SHA-256 of the certificate's DER SubjectPublicKeyInfo. It equals
//
//	openssl x509 -in ca.crt -pubkey -noout | openssl pkey -pubin -outform der | sha256sum
func SPKIPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return pinPrefix + hex.EncodeToString(sum[:])
}

// ValidatePin reports whether pin is well formed: "sha256:" and 64 hex
// digits. Upper-case hex is accepted, as kubeadm does.
func ValidatePin(pin string) error {
	_, err := parsePin(pin)
	return err
}

func parsePin(pin string) ([]byte, error) {
	hexPart, ok := strings.CutPrefix(pin, pinPrefix)
	if !ok {
		return nil, fmt.Errorf("CA pin %q must start with %q (the format of gpurack.enroll.ca and kubeadm's --discovery-token-ca-cert-hash)", pin, pinPrefix)
	}
	sum, err := hex.DecodeString(hexPart)
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("CA pin %q must be %q followed by %d hex digits", pin, pinPrefix, 2*sha256.Size)
	}
	return sum, nil
}

// VerifyPin returns nil if cert's SPKIPin is pin, and an error saying what
// differs otherwise.
func VerifyPin(cert *x509.Certificate, pin string) error {
	want, err := parsePin(pin)
	if err != nil {
		return err
	}
	got := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	if subtle.ConstantTimeCompare(got[:], want) != 1 {
		return fmt.Errorf("certificate %q has pin %s, not %s", cert.Subject.CommonName, SPKIPin(cert), strings.ToLower(pin))
	}
	return nil
}

// PinnedVerifyOptions says what VerifyLeafAgainstPin requires of the leaf
// besides chaining to the pinned CA.
type PinnedVerifyOptions struct {
	// Usage the leaf must be issued for: ServerAuth when checking a
	// server, ClientAuth when checking a client. Required.
	Usage Usage
	// DNSName, if not empty, must be one of the leaf's SANs (an IP address
	// is matched against IP SANs).
	DNSName string
	// Role, if not empty, must be the leaf's RoleOf.
	Role Role
	// CurrentTime is the time to check validity at; zero means now.
	CurrentTime time.Time
}

// VerifyLeafAgainstPin checks a peer's certificate chain as sent in a TLS
// handshake (leaf first, then the rest in any order) for a client that trusts
// exactly one CA, named by its pin: some certificate in chain must have the
// pinned public key, and the leaf must verify (signature, validity, usage,
// and opts) against that certificate as the only root, the other chain
// certificates serving as intermediates. It returns the verified leaf.
//
// A chain that merely contains the pinned CA certificate next to a leaf it
// did not sign fails: the pin selects the root, the signature check does the
// rest. Together with the TLS handshake's proof that the peer holds the
// leaf's key, this is what makes the pin mean something.
func VerifyLeafAgainstPin(chain []*x509.Certificate, pin string, opts PinnedVerifyOptions) (*x509.Certificate, error) {
	want, err := parsePin(pin)
	if err != nil {
		return nil, err
	}
	var usage x509.ExtKeyUsage
	switch opts.Usage {
	case ServerAuth:
		usage = x509.ExtKeyUsageServerAuth
	case ClientAuth:
		usage = x509.ExtKeyUsageClientAuth
	default:
		return nil, errors.New("verify against pin: PinnedVerifyOptions.Usage must be ServerAuth or ClientAuth")
	}
	if len(chain) == 0 || chain[0] == nil {
		return nil, errors.New("verify against pin: the peer sent no certificate")
	}
	leaf := chain[0]
	roots := x509.NewCertPool()
	intermediates := x509.NewCertPool()
	found := false
	var names []string
	for _, c := range chain {
		if c == nil {
			continue
		}
		names = append(names, fmt.Sprintf("%q", c.Subject.CommonName))
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		if subtle.ConstantTimeCompare(sum[:], want) == 1 {
			roots.AddCert(c)
			found = true
		} else if c != leaf {
			intermediates.AddCert(c)
		}
	}
	if !found {
		return nil, fmt.Errorf("verify against pin: none of the %d certificates the peer sent (%s) has the pinned key %s: check that the pin is the CA's (gpurack.enroll.ca or --enroll-ca) and that the server sends the CA certificate in its chain",
			len(names), strings.Join(names, ", "), strings.ToLower(pin))
	}
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		DNSName:       opts.DNSName,
		KeyUsages:     []x509.ExtKeyUsage{usage},
		CurrentTime:   opts.CurrentTime,
	})
	if err != nil {
		return nil, fmt.Errorf("verify against pin: certificate %q does not verify against the pinned CA: %w", leaf.Subject.CommonName, err)
	}
	if opts.Role != "" {
		if got := RoleOf(leaf); got != opts.Role {
			return nil, fmt.Errorf("verify against pin: certificate %q has role %q, want %q", leaf.Subject.CommonName, got, opts.Role)
		}
	}
	return leaf, nil
}

// ClientConfigPinned returns a TLS client configuration for reaching gpuboot
// when all the client knows is the gpurack CA's pin (the agent before it has
// a JoinBundle). The server must present a chain that includes the CA
// certificate (docs/contracts.md §3); its leaf must verify against that CA for
// serverAuth, carry role RoleServers, and, when the client connects by host
// name, name that host.
//
// Normal verification is switched off (InsecureSkipVerify) because the CA is
// not in any root pool; VerifyConnection does the whole check instead. It is
// used rather than VerifyPeerCertificate because it also runs on resumed
// sessions and sees the server name. A malformed pin makes every handshake
// fail; check it first with ValidatePin to report it early.
//
// The caller may add Certificates (the agent's client certificate) and
// NextProtos to the returned config.
func ClientConfigPinned(pin string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			// cs.ServerName is the SNI the client sent: the host name it
			// dialled, or empty when it dialled an IP address (SNI carries
			// no addresses; the role check still applies then).
			_, err := VerifyLeafAgainstPin(cs.PeerCertificates, pin, PinnedVerifyOptions{
				Usage:   ServerAuth,
				DNSName: cs.ServerName,
				Role:    RoleServers,
			})
			return err
		},
	}
}

package enroll

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// EKRoots are the TPM vendors' certificate authorities an EK certificate must chain to
// (enrollment.ekRoots): with them, only a TPM whose maker certified its Endorsement Key
// is believed, and a software TPM or a TPM whose certificate is missing is refused
// before any challenge (decision 0653). Without them the EK is trusted on first use.
type EKRoots struct {
	roots, intermediates *x509.CertPool
	// names are the roots' subjects, for messages.
	names []string
}

// oidSubjectAltName is the SAN extension. TCG EK certificates carry the TPM's maker,
// model and version there as a directoryName and mark it critical (TCG EK Credential
// Profile §3.2.9); Go's verifier treats a critical SAN with no DNS, email, IP or URI
// name as unhandled, so it is taken as handled here: an EK certificate names a chip,
// not a host, and no name of it is checked.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// LoadEKRoots reads PEM files of vendor certificates. Self-signed certificates are
// roots; the others are intermediates that may stand between a root and an EK
// certificate (vendors publish both; TPMs hold only the EK certificate).
func LoadEKRoots(paths []string) (*EKRoots, error) {
	r := &EKRoots{roots: x509.NewCertPool(), intermediates: x509.NewCertPool()}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("enrollment.ekRoots: %w", err)
		}
		n := 0
		for rest := data; ; n++ {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("enrollment.ekRoots: %s: a %q PEM block; only CERTIFICATE blocks belong there", p, b.Type)
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("enrollment.ekRoots: %s: certificate %d: %w", p, n+1, err)
			}
			if c.CheckSignatureFrom(c) == nil && c.Subject.String() == c.Issuer.String() {
				r.roots.AddCert(c)
				r.names = append(r.names, c.Subject.String())
			} else {
				r.intermediates.AddCert(c)
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("enrollment.ekRoots: %s holds no PEM certificate", p)
		}
	}
	if len(r.names) == 0 {
		return nil, fmt.Errorf("enrollment.ekRoots: %v hold no self-signed root, only intermediates: add the vendor's root certificate", paths)
	}
	return r, nil
}

// Roots names the root certificates' subjects.
func (r *EKRoots) Roots() []string { return slices.Clone(r.names) }

// Verify checks that der, an EK certificate (its key already matched to the EK by
// parseAttestation), chains to one of the roots at now. It returns the root's subject.
func (r *EKRoots) Verify(der []byte, now time.Time) (string, error) {
	if len(der) == 0 {
		return "", errors.New("the agent sent no EK certificate: its TPM holds none in NV index 0x01c00002 or 0x01c0000a (a software TPM, or one its maker did not certify)")
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return "", fmt.Errorf("the EK certificate does not parse: %w", err)
	}
	c.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(c.UnhandledCriticalExtensions), func(o asn1.ObjectIdentifier) bool {
		return o.Equal(oidSubjectAltName)
	})
	chains, err := c.Verify(x509.VerifyOptions{Roots: r.roots, Intermediates: r.intermediates, CurrentTime: now,
		// EK certificates carry the TCG EKU (2.23.133.8.1), or none.
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return "", fmt.Errorf("the EK certificate (issuer %q) does not chain to enrollment.ekRoots: %w", c.Issuer.String(), err)
	}
	chain := chains[0]
	return chain[len(chain)-1].Subject.String(), nil
}

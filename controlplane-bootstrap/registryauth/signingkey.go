package registryauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// Files of the token signing key in the cluster's pki directory. The registry trusts
// exactly SigningCertFile (its auth.token.rootcertbundle), not the cluster CA: every
// node's certificate is signed by the CA, and none of them may mint tokens.
const (
	SigningKeyFile  = "registry-token.key"
	SigningCertFile = "registry-token.crt"
	// SigningValidity is the signing certificate's lifetime. It is long because
	// rotating it means restarting the registry with the new bundle; the key never
	// leaves the control plane host.
	SigningValidity = 20 * 365 * 24 * time.Hour
)

// EnsureSigningKey makes pkiDir/registry-token.key (ECDSA P-256, PKCS#8) and
// pkiDir/registry-token.crt (self-signed over it, CN gpurack-registry-auth) if either is
// missing, and keeps them otherwise (after checking that they belong together). It
// returns the certificate's path, for the registry's rootcertbundle.
func EnsureSigningKey(pkiDir string) (certPath string, err error) {
	keyPath := filepath.Join(pkiDir, SigningKeyFile)
	certPath = filepath.Join(pkiDir, SigningCertFile)
	_, kerr := os.Stat(keyPath)
	_, cerr := os.Stat(certPath)
	if kerr == nil && cerr == nil {
		if _, _, err := LoadSigningKey(keyPath, certPath); err != nil {
			return "", err
		}
		return certPath, nil
	}
	if (kerr != nil && !errors.Is(kerr, fs.ErrNotExist)) || (cerr != nil && !errors.Is(cerr, fs.ErrNotExist)) {
		return "", fmt.Errorf("registry token signing key: %w", errors.Join(kerr, cerr))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return "", err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: Issuer},
		NotBefore:             now,
		NotAfter:              now.Add(SigningValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return "", fmt.Errorf("registry token signing certificate: %w", err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return "", err
	}
	cert, _ := x509.ParseCertificate(der)
	// The key first: a certificate without its key would be kept by the next run.
	if err := atomicfile.WriteMkdirAll(keyPath, keyPEM, 0o600, 0o700); err != nil {
		return "", err
	}
	if err := atomicfile.WriteMkdirAll(certPath, pki.EncodeCertPEM(cert), 0o644, 0o700); err != nil {
		return "", err
	}
	return certPath, nil
}

// LoadSigningKey reads the signing key and certificate and checks that the
// certificate is over the key.
func LoadSigningKey(keyPath, certPath string) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("registry token signing key: %w", err)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("registry token signing certificate: %w", err)
	}
	signer, err := pki.DecodeKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("registry token signing key %s: %w", keyPath, err)
	}
	key, ok := signer.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, nil, fmt.Errorf("registry token signing key %s: want ECDSA P-256 (ES256)", keyPath)
	}
	cert, err := pki.DecodeCertPEM(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("registry token signing certificate %s: %w", certPath, err)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(key.Public()) {
		return nil, nil, fmt.Errorf("registry token signing certificate %s is not over the key %s: delete both and run init again (then restart the registry)", certPath, keyPath)
	}
	return key, cert, nil
}

package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// PEM block types.
const (
	pemCertificate = "CERTIFICATE"
	pemPrivateKey  = "PRIVATE KEY" // PKCS#8, RFC 5958
)

// EncodeCertPEM returns cert as a PEM "CERTIFICATE" block.
func EncodeCertPEM(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: cert.Raw})
}

// DecodeCertPEM parses the single certificate in data. Anything other than
// exactly one "CERTIFICATE" block (and surrounding text) is an error.
func DecodeCertPEM(data []byte) (*x509.Certificate, error) {
	certs, err := DecodeCertsPEM(data)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("want one certificate, found %d PEM CERTIFICATE blocks", len(certs))
	}
	return certs[0], nil
}

// DecodeCertsPEM parses every "CERTIFICATE" block in data, in order (a
// chain or a bundle). A block of another type, or no block at all, is an
// error.
func DecodeCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != pemCertificate {
			return nil, fmt.Errorf("PEM block %d is %q, want %q", n, block.Type, pemCertificate)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	return certs, nil
}

// EncodeKeyPEM returns key as an unencrypted PKCS#8 PEM "PRIVATE KEY" block.
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key as PKCS#8: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// DecodeKeyPEM parses an unencrypted PKCS#8 "PRIVATE KEY" block.
func DecodeKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found: want an unencrypted PKCS#8 \"PRIVATE KEY\"")
	}
	switch block.Type {
	case pemPrivateKey:
	case "EC PRIVATE KEY", "RSA PRIVATE KEY":
		return nil, fmt.Errorf("PEM block is %q, want PKCS#8 %q: convert it with `openssl pkcs8 -topk8 -nocrypt`", block.Type, pemPrivateKey)
	case "ENCRYPTED PRIVATE KEY":
		return nil, fmt.Errorf("the private key is encrypted: decrypt it with `openssl pkcs8 -topk8 -nocrypt`")
	default:
		return nil, fmt.Errorf("PEM block is %q, want %q", block.Type, pemPrivateKey)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PKCS#8 private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	return signer, nil
}

package registryauth

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Constants shared with the registry's configuration (auth.token in its config.yml).
const (
	// Service is the registry's service name: the token's audience.
	Service = "gpurack-registry"
	// Issuer is the token's iss, which the registry trusts.
	Issuer = "gpurack-registry-auth"
	// Port is the issuer's port; the registry's realm is https://ADVERTISE:5001/token.
	Port = 5001
	// TokenTTL is how long a token is valid. Clients ask again for each operation;
	// a revoked credential is refused at its next request, and a token already
	// issued to it lives at most this long.
	TokenTTL = 5 * time.Minute
)

// Claims are a registry token's claims
// (https://distribution.github.io/distribution/spec/auth/jwt/).
type Claims struct {
	Issuer    string   `json:"iss"`
	Subject   string   `json:"sub"`
	Audience  string   `json:"aud"`
	Expiry    int64    `json:"exp"`
	NotBefore int64    `json:"nbf"`
	IssuedAt  int64    `json:"iat"`
	ID        string   `json:"jti"`
	Access    []Access `json:"access"`
}

// TokenResponse is the body of a successful token request
// (https://distribution.github.io/distribution/spec/auth/token/): the token under
// both names clients read.
type TokenResponse struct {
	Token       string `json:"token"`
	AccessToken string `json:"access_token"`
	ExpiresIn   int    `json:"expires_in"`
	IssuedAt    string `json:"issued_at"`
}

// Minter signs registry tokens with the signing key.
type Minter struct {
	signer jose.Signer
}

// NewMinter returns a Minter signing ES256 with key, its header carrying cert (the
// certificate the registry trusts) as x5c, so that the registry verifies the chain
// against its rootcertbundle.
func NewMinter(key *ecdsa.PrivateKey, cert *x509.Certificate) (*Minter, error) {
	opts := (&jose.SignerOptions{}).WithType("JWT").
		WithHeader("x5c", []string{base64.StdEncoding.EncodeToString(cert.Raw)})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, opts)
	if err != nil {
		return nil, fmt.Errorf("registry token signer: %w", err)
	}
	return &Minter{signer: signer}, nil
}

// Mint signs a token for subject, audience service, granting access, valid from now
// for TokenTTL.
func (m *Minter) Mint(subject, service string, access []Access, now time.Time) (TokenResponse, error) {
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return TokenResponse{}, err
	}
	if access == nil {
		access = []Access{}
	}
	c := Claims{
		Issuer: Issuer, Subject: subject, Audience: service,
		IssuedAt: now.Unix(), NotBefore: now.Unix(), Expiry: now.Add(TokenTTL).Unix(),
		ID: hex.EncodeToString(jti), Access: access,
	}
	raw, err := jwt.Signed(m.signer).Claims(c).Serialize()
	if err != nil {
		return TokenResponse{}, fmt.Errorf("sign registry token: %w", err)
	}
	return TokenResponse{Token: raw, AccessToken: raw, ExpiresIn: int(TokenTTL / time.Second),
		IssuedAt: now.UTC().Format(time.RFC3339)}, nil
}

package registryauth

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/gpurack/gpurack/internal/pki"
)

// verifyToken checks raw as distribution v3's token access controller does
// (registry/auth/token/token.go): ES256 only, the x5c chain verified against the
// root bundle (any key usage), the signature, iss, aud, and exp and nbf with its 60 s
// leeway, at now. It returns the claims.
func verifyToken(t *testing.T, raw string, roots *x509.CertPool, now time.Time) (*Claims, error) {
	t.Helper()
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		return nil, err
	}
	if len(tok.Headers) != 1 {
		return nil, errors.New("not one signature")
	}
	chains, err := tok.Headers[0].Certificates(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: now})
	if err != nil {
		return nil, err
	}
	var c Claims
	if err := tok.Claims(chains[0][0].PublicKey, &c); err != nil {
		return nil, err
	}
	leeway := 60 * time.Second
	switch {
	case c.Issuer != Issuer:
		return nil, errors.New("issuer " + c.Issuer)
	case c.Audience != Service:
		return nil, errors.New("audience " + c.Audience)
	case now.After(time.Unix(c.Expiry, 0).Add(leeway)):
		return nil, errors.New("expired")
	case now.Before(time.Unix(c.NotBefore, 0).Add(-leeway)):
		return nil, errors.New("not yet valid")
	}
	return &c, nil
}

func testMinter(t *testing.T) (*Minter, *x509.CertPool, string) {
	t.Helper()
	dir := t.TempDir()
	certPath, err := EnsureSigningKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, cert, err := LoadSigningKey(filepath.Join(dir, SigningKeyFile), certPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMinter(key, cert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return m, roots, dir
}

func TestTokenClaimsVerifyAsTheRegistryDoes(t *testing.T) {
	m, roots, _ := testMinter(t)
	now := time.Now()
	access := []Access{{TypeRepository, "team-a/train", []string{"pull", "push"}}}
	resp, err := m.Mint("alice", Service, access, now)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Token != resp.AccessToken || resp.ExpiresIn != 300 || resp.IssuedAt != now.UTC().Format(time.RFC3339) {
		t.Errorf("response %+v", resp)
	}
	c, err := verifyToken(t, resp.Token, roots, now)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "alice" || c.IssuedAt != now.Unix() || c.NotBefore != now.Unix() || c.Expiry != now.Add(5*time.Minute).Unix() ||
		len(c.ID) != 32 || !reflect.DeepEqual(c.Access, access) {
		t.Errorf("claims %+v", c)
	}
	// The registry parses access into its ResourceActions: type, name, actions.
	tok, _ := jwt.ParseSigned(resp.Token, []jose.SignatureAlgorithm{jose.ES256})
	var raw map[string]any
	tok.UnsafeClaimsWithoutVerification(&raw)
	b, _ := json.Marshal(raw["access"])
	if string(b) != `[{"actions":["pull","push"],"name":"team-a/train","type":"repository"}]` {
		t.Errorf("access claim %s", b)
	}
	if tok.Headers[0].Algorithm != "ES256" {
		t.Errorf("alg %s", tok.Headers[0].Algorithm)
	}

	if _, err := verifyToken(t, resp.Token, roots, now.Add(6*time.Minute+time.Second)); err == nil {
		t.Error("a token 6 minutes old verified")
	}
	login, _ := m.Mint("alice", Service, nil, now)
	if c, err := verifyToken(t, login.Token, roots, now); err != nil || c.Access == nil || len(c.Access) != 0 {
		t.Errorf("a login token: %+v %v (access must be [], not null)", c, err)
	}
	other, _ := m.Mint("alice", "another-registry", access, now)
	if _, err := verifyToken(t, other.Token, roots, now); err == nil {
		t.Error("a token for another service verified")
	}
}

func TestTokenOfAnotherKeyIsNotTrusted(t *testing.T) {
	m, _, _ := testMinter(t)
	_, roots, _ := testMinter(t)
	resp, _ := m.Mint("alice", Service, nil, time.Now())
	if _, err := verifyToken(t, resp.Token, roots, time.Now()); err == nil {
		t.Error("a token signed by another key verified")
	}
	// A node's certificate from the cluster CA cannot sign tokens the registry
	// accepts, not even with the CA in the bundle's place: the bundle is the signing
	// certificate alone.
	ca, err := pki.NewCA(pki.CARequest{CommonName: "cluster-ca"})
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(pki.CertRequest{CommonName: "system:node:n1", Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	nm, err := NewMinter(node.Key.(*ecdsa.PrivateKey), node.Cert)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := nm.Mint("node", Service, []Access{{TypeRepository, "team-a/x", []string{"push"}}}, time.Now())
	_, own, _ := testMinter(t)
	if _, err := verifyToken(t, forged.Token, own, time.Now()); err == nil {
		t.Error("a token signed with a node's CA-issued key verified against the signing bundle")
	}
	if _, err := verifyToken(t, forged.Token, ca.CertPool(), time.Now()); err != nil {
		t.Errorf("control: the same token against the cluster CA should verify (so the bundle is what refuses it): %v", err)
	}
}

func TestEnsureSigningKeyKeepsTheKey(t *testing.T) {
	dir := t.TempDir()
	certPath, err := EnsureSigningKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(certPath)
	if _, err := EnsureSigningKey(dir); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(certPath)
	if string(first) != string(again) {
		t.Error("a second EnsureSigningKey replaced the certificate")
	}
	if fi, err := os.Stat(filepath.Join(dir, SigningKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi, err)
	}
	cert, err := pki.DecodeCertPEM(first)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != Issuer || cert.IsCA || time.Until(cert.NotAfter) < 19*365*24*time.Hour {
		t.Errorf("certificate %s, CA %v, until %s", cert.Subject, cert.IsCA, cert.NotAfter)
	}
	// A certificate that is not over the key is refused, not silently kept or replaced.
	other := t.TempDir()
	if _, err := EnsureSigningKey(other); err != nil {
		t.Fatal(err)
	}
	otherCert, _ := os.ReadFile(filepath.Join(other, SigningCertFile))
	os.WriteFile(certPath, otherCert, 0o644)
	if _, err := EnsureSigningKey(dir); err == nil {
		t.Error("a certificate of another key was accepted")
	}
}

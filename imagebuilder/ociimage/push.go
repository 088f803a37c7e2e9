package ociimage

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// AuthFile is a containers auth file (containers-auth.json(5), what `skopeo
// --authfile` and `podman login` read and write): credentials keyed by registry host,
// or by host and repository path for a narrower entry.
type AuthFile struct {
	Auths map[string]authn.AuthConfig `json:"auths"`
}

// maxAuthFile bounds an auth file; real ones are a few KiB.
const maxAuthFile = 1 << 20

// ParseAuthFile decodes an auth file. Each entry's "auth" is base64 of user:password
// (or username and password given apart); an entry that decodes to nothing is an
// error naming it.
func ParseAuthFile(data []byte) (*AuthFile, error) {
	if len(data) > maxAuthFile {
		return nil, fmt.Errorf("auth file is %d bytes; at most %d", len(data), maxAuthFile)
	}
	var f AuthFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("auth file: %w (want {\"auths\": {\"registry.example\": {\"auth\": \"BASE64(user:password)\"}}})", err)
	}
	for k, a := range f.Auths {
		if a.Username == "" && a.IdentityToken == "" && a.RegistryToken == "" {
			return nil, fmt.Errorf("auth file: entry %q has no credentials", k)
		}
	}
	return &f, nil
}

// Lookup returns the credentials for repository repo (host/path): the entry of the
// longest key that is repo or a path prefix of it (scheme prefixes such as https:// in
// keys are ignored), or false.
func (f *AuthFile) Lookup(repo string) (authn.AuthConfig, bool) {
	best, found := "", false
	var out authn.AuthConfig
	for k, a := range f.Auths {
		key := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://"), "/")
		if (repo == key || strings.HasPrefix(repo, key+"/")) && len(key) >= len(best) {
			if len(key) == len(best) && found && k > best {
				continue
			}
			best, out, found = key, a, true
		}
	}
	return out, found
}

// PushOptions say where and how to push.
type PushOptions struct {
	Ref string // image reference, registry host included
	// CA is a PEM file of certificates trusted besides the system's.
	CA string
	// AuthFile is a containers auth file; empty: anonymous.
	AuthFile string
}

// Push writes img to o.Ref and returns the pushed manifest's digest.
func Push(ctx context.Context, img v1.Image, o PushOptions) (string, error) {
	ref, err := name.ParseReference(o.Ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("--push %q: %w (want registry.example/team/image:tag)", o.Ref, err)
	}
	tr, err := transport(o.CA)
	if err != nil {
		return "", err
	}
	auth := authn.Anonymous
	if o.AuthFile != "" {
		data, err := os.ReadFile(o.AuthFile)
		if err != nil {
			return "", fmt.Errorf("--authfile: %w", err)
		}
		f, err := ParseAuthFile(data)
		if err != nil {
			return "", fmt.Errorf("--authfile %s: %w", o.AuthFile, err)
		}
		if a, ok := f.Lookup(ref.Context().Name()); ok {
			auth = authn.FromConfig(a)
		} else {
			return "", fmt.Errorf("--authfile %s has no entry for %s", o.AuthFile, ref.Context().RegistryStr())
		}
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithTransport(tr), remote.WithAuth(auth)); err != nil {
		return "", fmt.Errorf("push %s: %w", o.Ref, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

// transport trusts the system's roots and, when caFile is set, its certificates.
func transport(caFile string) (http.RoundTripper, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile == "" {
		return tr, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca %s holds no PEM certificate", caFile)
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr, nil
}

package admin

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// Tokens are operator bearer tokens for the REST API and the rack view. The file holds
// one operator per line, "NAME sha256:HEX" (the sha256 of the token; the token itself
// is never stored); '#' starts a comment.
type Tokens struct {
	byHash map[[32]byte]string
}

// LoadTokens reads a token file. A missing file is an empty set.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{byHash: map[[32]byte]string{}}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("operator tokens: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, " ")
		hash = strings.TrimSpace(hash)
		raw, err := hex.DecodeString(strings.TrimPrefix(hash, "sha256:"))
		if !ok || name == "" || !strings.HasPrefix(hash, "sha256:") || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("operator tokens %s line %d: want \"NAME sha256:HEX\" (gpuboot certs operator NAME --token writes it)", path, n)
		}
		t.byHash[[32]byte(raw)] = name
	}
	return t, sc.Err()
}

// Operator returns the operator a bearer token belongs to.
func (t *Tokens) Operator(token string) (string, bool) {
	if t == nil || token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	for h, name := range t.byHash {
		if subtle.ConstantTimeCompare(h[:], sum[:]) == 1 {
			return name, true
		}
	}
	return "", false
}

// NewToken returns a fresh token for operator name and the line to append to the token
// file.
func NewToken(name string) (token, line string, err error) {
	if name == "" || strings.ContainsAny(name, " \t\n#") {
		return "", "", fmt.Errorf("operator name %q: use a name without spaces or '#'", name)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = "gpo_" + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	return token, name + " sha256:" + hex.EncodeToString(sum[:]) + "\n", nil
}

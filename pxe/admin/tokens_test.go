package admin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "operator-tokens")
	tokA, lineA, err := NewToken("alice")
	if err != nil {
		t.Fatal(err)
	}
	tokB, lineB, _ := NewToken("bob")
	os.WriteFile(p, []byte("# operators\n"+lineA+lineB), 0o600)
	ts, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := ts.Operator(tokA); !ok || name != "alice" {
		t.Errorf("alice's token: %q %v", name, ok)
	}
	if name, ok := ts.Operator(tokB); !ok || name != "bob" {
		t.Errorf("bob's token: %q %v", name, ok)
	}
	for _, bad := range []string{"", tokA + "x", strings.TrimPrefix(lineA, "alice ")} {
		if _, ok := ts.Operator(bad); ok {
			t.Errorf("token %q accepted", bad)
		}
	}
	if strings.Contains(lineA, tokA) {
		t.Error("the token file line holds the token itself")
	}
	os.WriteFile(p, []byte("alice plaintext-token\n"), 0o600)
	if _, err := LoadTokens(p); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed token file: %v", err)
	}
	if ts, err := LoadTokens(filepath.Join(dir, "missing")); err != nil || ts == nil {
		t.Errorf("missing token file: %v", err)
	}
	if _, _, err := NewToken("a b"); err == nil {
		t.Error("operator name with a space accepted")
	}
	var nilTokens *Tokens
	if _, ok := nilTokens.Operator(tokA); ok {
		t.Error("nil token set accepted a token")
	}
}

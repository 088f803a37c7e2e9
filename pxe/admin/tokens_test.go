package admin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "operator-tokens")
	exp := time.Now().Add(time.Hour)
	tokA, lineA, err := NewToken("alice", exp)
	if err != nil {
		t.Fatal(err)
	}
	tokB, lineB, _ := NewToken("bob", exp)
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
	if _, _, err := NewToken("a b", exp); err == nil {
		t.Error("operator name with a space accepted")
	}
	if _, _, err := NewToken("carol", time.Time{}); err == nil {
		t.Error("a token without an expiry was issued")
	}
	var nilTokens *Tokens
	if _, ok := nilTokens.Operator(tokA); ok {
		t.Error("nil token set accepted a token")
	}
}

// TestTokensExpireAndReload: an expired token is refused; the file is read again when
// it changes, so a removed operator's token stops working and a new one starts without
// a restart; a file that stops parsing keeps the tokens in use; a legacy line without
// expiry still works and is named.
func TestTokensExpireAndReload(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "operator-tokens")
	clock := time.Now()
	tokA, lineA, _ := NewToken("alice", clock.Add(time.Hour))
	tokB, lineB, _ := NewToken("bob", clock.Add(time.Hour))
	if err := os.WriteFile(p, []byte(lineA+lineB), 0o600); err != nil {
		t.Fatal(err)
	}
	ts, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	ts.now = func() time.Time { return clock }
	tick := func(d time.Duration) { clock = clock.Add(d) }

	n, err := RemoveOperatorTokens(p, "bob")
	if err != nil || n != 1 {
		t.Fatalf("remove bob: %d, %v", n, err)
	}
	tick(2 * time.Second)
	if _, ok := ts.Operator(tokB); ok {
		t.Fatal("bob's token still works after it was removed from the file")
	}
	if name, ok := ts.Operator(tokA); !ok || name != "alice" {
		t.Fatalf("alice's token after bob's removal: %q %v", name, ok)
	}
	tokC, lineC, _ := NewToken("carol", clock.Add(time.Hour))
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0o600)
	f.WriteString(lineC)
	f.Close()
	tick(2 * time.Second)
	if name, ok := ts.Operator(tokC); !ok || name != "carol" {
		t.Fatalf("a token added while running: %q %v", name, ok)
	}
	os.WriteFile(p, []byte(lineA+"garbage\n"), 0o600)
	tick(2 * time.Second)
	if _, ok := ts.Operator(tokA); !ok || ts.Err() == nil {
		t.Fatalf("a file that no longer parses: alice %v, err %v; want the old tokens kept and the error reported", ok, ts.Err())
	}
	tick(2 * time.Hour)
	if _, ok := ts.Operator(tokA); ok {
		t.Fatal("an expired token was accepted")
	}
	legacy := strings.Fields(lineA)[0] + " " + strings.Fields(lineA)[1] + "\n"
	os.WriteFile(p, []byte(legacy), 0o600)
	tick(2 * time.Second)
	if name, ok := ts.Operator(tokA); !ok || name != "alice" || len(ts.Legacy()) != 1 {
		t.Fatalf("legacy line: %q %v, legacy %v", name, ok, ts.Legacy())
	}
}

func FuzzParseTokens(f *testing.F) {
	_, line, _ := NewToken("alice", time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	f.Add([]byte("# c\n" + line))
	f.Add([]byte("bob sha256:00 expires=x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseTokens(data)
		if err == nil && entries == nil {
			t.Fatal("nil entries without an error")
		}
	})
}

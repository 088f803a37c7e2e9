package registryauth

import (
	"encoding/base64"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

func TestParseBasic(t *testing.T) {
	for _, tc := range []struct {
		header, user, password string
		ok                     bool
	}{
		{basic("alice", "pw"), "alice", "pw", true},
		{basic("alice", "p:w"), "alice", "p:w", true},
		{basic("robot+team-a", ""), "robot+team-a", "", true},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("alice:pw")), "alice", "pw", true},
		{basic("", "pw"), "", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice")), "", "", false},
		{"Bearer abc", "", "", false},
		{"Basic", "", "", false},
		{"Basic  " + base64.StdEncoding.EncodeToString([]byte("alice:pw")), "", "", false},
		{"Basic " + base64.RawStdEncoding.EncodeToString([]byte("alice:p")), "", "", false},
		{"Basic !!!", "", "", false},
		{basic("al\x00ice", "pw"), "", "", false},
		{basic("alice", "p\nw"), "", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice:\xff")), "", "", false},
		{basic("alice", strings.Repeat("x", MaxAuthorizationLen)), "", "", false},
		{"", "", "", false},
	} {
		u, p, ok := ParseBasic(tc.header)
		if u != tc.user || p != tc.password || ok != tc.ok {
			t.Errorf("ParseBasic(%.40q) = %q %q %v; want %q %q %v", tc.header, u, p, ok, tc.user, tc.password, tc.ok)
		}
	}
}

// FuzzParseBasic: no panic; what is accepted has a non-empty user without ':', no
// control character and valid UTF-8, and encodes back to a header that parses the same.
func FuzzParseBasic(f *testing.F) {
	for _, h := range []string{basic("alice", "pw"), "Basic", "Basic =", "bAsIc YTpi", basic("a", "b:c")} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, header string) {
		u, p, ok := ParseBasic(header)
		if !ok {
			if u != "" || p != "" {
				t.Fatalf("refused %q but returned %q %q", header, u, p)
			}
			return
		}
		s := u + ":" + p
		if u == "" || strings.Contains(u, ":") || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
			t.Fatalf("accepted %q: user %q password %q", header, u, p)
		}
		if u2, p2, ok2 := ParseBasic(basic(u, p)); !ok2 || u2 != u || p2 != p {
			t.Fatalf("%q %q does not round-trip", u, p)
		}
	})
}

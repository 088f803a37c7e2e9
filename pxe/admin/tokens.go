package admin

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// DefaultTokenTTL is how long a new operator token is valid.
const DefaultTokenTTL = 30 * 24 * time.Hour

// maxTokenFile bounds the token file gpuboot reads.
const maxTokenFile = 1 << 20

// reloadEvery is how often at most a token check looks whether the file changed.
const reloadEvery = time.Second

// Tokens are operator bearer tokens for the REST API and the rack view. The file holds
// one token per line, "NAME sha256:HEX expires=RFC3339" (the sha256 of the token; the
// token itself is never stored); '#' starts a comment. A line without expires= (what
// gpuboot wrote before tokens expired) is accepted and reported by Legacy. The file is
// read again when it changes, so a token added or removed (`gpuboot operators revoke`)
// takes effect without a restart.
type Tokens struct {
	path string
	now  func() time.Time

	mu      sync.Mutex
	entries map[[32]byte]tokenEntry
	stamp   fileStamp // of the file the entries were read from
	checked time.Time // when the file was last looked at
	err     error     // the last reload's error: the previous entries stay in use
}

type tokenEntry struct {
	name    string
	expires time.Time // zero: a legacy line without expiry
}

type fileStamp struct {
	mod  time.Time
	size int64
	ok   bool // the file exists
}

// LoadTokens reads a token file. A missing file is an empty set (tokens created later
// are picked up).
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path, now: time.Now}
	entries, stamp, err := readTokens(path)
	if err != nil {
		return nil, err
	}
	t.entries, t.stamp, t.checked = entries, stamp, t.now()
	return t, nil
}

func readTokens(path string) (map[[32]byte]tokenEntry, fileStamp, error) {
	entries := map[[32]byte]tokenEntry{}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return entries, fileStamp{}, nil
	}
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("operator tokens: %w", err)
	}
	if fi.Size() > maxTokenFile {
		return nil, fileStamp{}, fmt.Errorf("operator tokens %s: %d bytes; at most %d", path, fi.Size(), maxTokenFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("operator tokens: %w", err)
	}
	entries, err = ParseTokens(data)
	if err != nil {
		return nil, fileStamp{}, fmt.Errorf("operator tokens %s: %w", path, err)
	}
	return entries, fileStamp{mod: fi.ModTime(), size: fi.Size(), ok: true}, nil
}

// ParseTokens parses a token file's content.
func ParseTokens(data []byte) (map[[32]byte]tokenEntry, error) {
	entries := map[[32]byte]tokenEntry{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		bad := fmt.Errorf("line %d: want \"NAME sha256:HEX expires=RFC3339\" (gpuboot certs operator NAME --token writes it)", n)
		if len(fields) < 2 || len(fields) > 3 || !strings.HasPrefix(fields[1], "sha256:") {
			return nil, bad
		}
		raw, err := hex.DecodeString(strings.TrimPrefix(fields[1], "sha256:"))
		if err != nil || len(raw) != 32 {
			return nil, bad
		}
		e := tokenEntry{name: fields[0]}
		if len(fields) == 3 {
			v, ok := strings.CutPrefix(fields[2], "expires=")
			if !ok {
				return nil, bad
			}
			if e.expires, err = time.Parse(time.RFC3339, v); err != nil {
				return nil, fmt.Errorf("line %d: expires=%q is not an RFC 3339 time", n, v)
			}
		}
		entries[[32]byte(raw)] = e
	}
	return entries, sc.Err()
}

// reload reads the file again when it changed since it was read, at most once per
// reloadEvery. A file that no longer parses keeps the tokens in use and is reported by
// Err. Called with t.mu held.
func (t *Tokens) reload() {
	now := t.now()
	if now.Sub(t.checked) < reloadEvery {
		return
	}
	t.checked = now
	var cur fileStamp
	if fi, err := os.Stat(t.path); err == nil {
		cur = fileStamp{mod: fi.ModTime(), size: fi.Size(), ok: true}
	}
	if cur == t.stamp {
		return
	}
	entries, stamp, err := readTokens(t.path)
	if err != nil {
		t.err = err
		return
	}
	t.entries, t.stamp, t.err = entries, stamp, nil
}

// Operator returns the operator a bearer token belongs to; an expired token belongs
// to nobody.
func (t *Tokens) Operator(token string) (string, bool) {
	if t == nil || token == "" {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reload()
	sum := sha256.Sum256([]byte(token))
	now := t.now()
	for h, e := range t.entries {
		if subtle.ConstantTimeCompare(h[:], sum[:]) == 1 {
			if !e.expires.IsZero() && now.After(e.expires) {
				return "", false
			}
			return e.name, true
		}
	}
	return "", false
}

// Legacy names the operators holding tokens without an expiry, for a warning.
func (t *Tokens) Legacy() []string {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, e := range t.entries {
		if e.expires.IsZero() && !slices.Contains(out, e.name) {
			out = append(out, e.name)
		}
	}
	slices.Sort(out)
	return out
}

// Err is the last reload's error (the file changed and no longer parses); nil when the
// tokens in use are the file's.
func (t *Tokens) Err() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// NewToken returns a fresh token for operator name, valid until expires, and the line
// to append to the token file.
func NewToken(name string, expires time.Time) (token, line string, err error) {
	if name == "" || strings.ContainsAny(name, " \t\n#") {
		return "", "", fmt.Errorf("operator name %q: use a name without spaces or '#'", name)
	}
	if expires.IsZero() {
		return "", "", errors.New("operator token: no expiry (tokens expire; see --token-ttl)")
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = "gpo_" + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	return token, name + " sha256:" + hex.EncodeToString(sum[:]) + " expires=" + expires.UTC().Format(time.RFC3339) + "\n", nil
}

// RemoveOperatorTokens rewrites the token file at path without name's tokens and
// returns how many it removed. Comments and other operators' lines are kept as they
// are.
func RemoveOperatorTokens(path, name string) (int, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var out bytes.Buffer
	removed := 0
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && !strings.HasPrefix(f[0], "#") && f[0] == name {
			removed++
			continue
		}
		out.WriteString(line)
	}
	if removed == 0 {
		return 0, nil
	}
	return removed, atomicfile.Write(path, out.Bytes(), 0o600)
}

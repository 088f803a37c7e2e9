package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// RevocationList is the set of serial numbers of certificates that gpuboot
// revoked (a decommissioned machine's agent certificate, a departed
// operator's). It is safe for concurrent use: gpuboot adds to it while its
// TLS servers consult it.
//
// On disk it is a JSON array of serial numbers as hex strings, for example
// ["3f1a…", "9c0b…"], written atomically by Save. Serials are compared by
// value, so "0A", "0a" and "a" are the same serial.
type RevocationList struct {
	saveMu  sync.Mutex // serializes Save: snapshot and write as one step
	mu      sync.RWMutex
	serials map[string]struct{} // key: lowercase hex, no leading zeros
}

// NewRevocationList returns a list holding serials.
func NewRevocationList(serials ...*big.Int) *RevocationList {
	l := &RevocationList{serials: map[string]struct{}{}}
	for _, s := range serials {
		l.Revoke(s)
	}
	return l
}

// Revoke adds serial to the list and reports whether it was new.
func (l *RevocationList) Revoke(serial *big.Int) bool {
	if serial == nil {
		return false
	}
	k := serial.Text(16)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.serials == nil {
		l.serials = map[string]struct{}{}
	}
	if _, ok := l.serials[k]; ok {
		return false
	}
	l.serials[k] = struct{}{}
	return true
}

// Contains reports whether serial is revoked.
func (l *RevocationList) Contains(serial *big.Int) bool {
	if serial == nil {
		return false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	_, ok := l.serials[serial.Text(16)]
	return ok
}

// Len returns how many serials are revoked.
func (l *RevocationList) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.serials)
}

// Serials returns the revoked serials as lowercase hex, in numeric order.
func (l *RevocationList) Serials() []string {
	l.mu.RLock()
	out := make([]string, 0, len(l.serials))
	for k := range l.serials {
		out = append(out, k)
	}
	l.mu.RUnlock()
	slices.SortFunc(out, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
	return out
}

// Check returns an error if any certificate in certs is revoked.
func (l *RevocationList) Check(certs []*x509.Certificate) error {
	for _, c := range certs {
		if c != nil && l.Contains(c.SerialNumber) {
			return fmt.Errorf("certificate %q (serial %s) has been revoked", c.Subject.CommonName, c.SerialNumber.Text(16))
		}
	}
	return nil
}

// VerifyPeerCertificate is a tls.Config.VerifyPeerCertificate hook that
// refuses a peer presenting a revoked certificate. Go does not call it on
// resumed sessions, so a peer revoked after its first handshake could
// resume: prefer VerifyConnection, or disable session tickets.
func (l *RevocationList) VerifyPeerCertificate(rawCerts [][]byte, _ [][]*x509.Certificate) error {
	certs := make([]*x509.Certificate, 0, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return fmt.Errorf("peer certificate %d: %w", i, err)
		}
		certs = append(certs, c)
	}
	return l.Check(certs)
}

// VerifyConnection is a tls.Config.VerifyConnection hook that refuses a
// peer presenting a revoked certificate. Unlike VerifyPeerCertificate it
// also runs on resumed sessions, so revocation takes effect at once.
func (l *RevocationList) VerifyConnection(cs tls.ConnectionState) error {
	return l.Check(cs.PeerCertificates)
}

// MarshalJSON encodes the list as a JSON array of hex serials in numeric
// order.
func (l *RevocationList) MarshalJSON() ([]byte, error) {
	return json.Marshal(l.Serials())
}

// Digest names the list's contents: the first 16 hex digits of the SHA-256 of its
// serials in numeric order, one per line. Agents report it in their heartbeats and
// gpuboot answers with the list when it differs.
func (l *RevocationList) Digest() string {
	sum := sha256.Sum256([]byte(strings.Join(l.Serials(), "\n")))
	return hex.EncodeToString(sum[:8])
}

// Replace makes serials (hex) the list's contents; on an error the list is unchanged.
func (l *RevocationList) Replace(serials []string) error {
	set := make(map[string]struct{}, len(serials))
	for i, h := range serials {
		n, err := parseSerial(h)
		if err != nil {
			return fmt.Errorf("revocation list entry %d: %w", i, err)
		}
		set[n.Text(16)] = struct{}{}
	}
	l.mu.Lock()
	l.serials = set
	l.mu.Unlock()
	return nil
}

// UnmarshalJSON replaces the list's contents with the JSON array of hex
// serials in data.
func (l *RevocationList) UnmarshalJSON(data []byte) error {
	var hexes []string
	if err := json.Unmarshal(data, &hexes); err != nil {
		return fmt.Errorf("revocation list must be a JSON array of hex serial numbers: %w", err)
	}
	return l.Replace(hexes)
}

// parseSerial parses a hex serial number; colons (openssl's "3F:1A:…"
// form) are ignored.
func parseSerial(s string) (*big.Int, error) {
	h := strings.ReplaceAll(s, ":", "")
	if h == "" {
		return nil, fmt.Errorf("serial %q is empty: want hex digits", s)
	}
	for _, c := range h {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return nil, fmt.Errorf("serial %q: want hex digits only", s)
		}
	}
	n, ok := new(big.Int).SetString(h, 16)
	if !ok || n.Sign() <= 0 {
		return nil, fmt.Errorf("serial %q must be a positive hex number", s)
	}
	return n, nil
}

// LoadRevocationList reads a list saved by Save. A missing file is an empty
// list (gpuboot before its first revocation).
func LoadRevocationList(path string) (*RevocationList, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewRevocationList(), nil
	}
	if err != nil {
		return nil, err
	}
	l := NewRevocationList()
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s: empty file; a revocation list is a JSON array such as [] or [\"3f1a\"]: restore it from backup or write []", path)
	}
	if err := l.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// saveHook, when set (tests only), runs between Save's snapshot and its write.
var saveHook func()

// Save writes the list to path atomically (temporary file, then rename),
// mode 0644. Saves are serialized, each snapshotting the list under the same
// lock as its write, so concurrent Revoke+Save calls never leave a file that
// lacks a serial an earlier-finished Save wrote.
func (l *RevocationList) Save(path string) error {
	l.saveMu.Lock()
	defer l.saveMu.Unlock()
	data, err := json.MarshalIndent(l.Serials(), "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if saveHook != nil {
		saveHook()
	}
	if err := atomicfile.Write(path, data, certFileMode); err != nil {
		return fmt.Errorf("save revocation list: %w", err)
	}
	return nil
}

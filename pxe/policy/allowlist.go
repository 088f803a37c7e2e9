package policy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/identity"
)

// Entry is one row of a rack manifest.
type Entry struct {
	// Serial and MAC identify the machine; at least one is set. When both are, both
	// must match.
	Serial string
	MAC    string
	// Rack and Slot place it; optional.
	Rack string
	Slot string
	// EKHash names the machine's TPM Endorsement Key, as the vendor reported it:
	// "sha256:" and 64 lowercase hex digits over the DER SubjectPublicKeyInfo of the
	// EK's public key. Optional; gpuboot uses it only with `identity: tpm` or
	// `tpm-or-fallback` (decision 0651). An ekCertificate column gives it too: the hash
	// of the certificate's public key.
	EKHash string
	// BMC is the machine's BMC Redfish address, "https://host[:port]" (pxe/bmc); empty
	// when the row names none. Only the address: the BMC accounts are in gpuboot's
	// state directory (bmc-credentials.yaml), never in the manifest.
	BMC string
	// Source is the manifest file the row is in, and Line its line number there (for
	// transition records and messages: "rack-r2.csv line 4"). Source and Line together
	// name one row, also when a List merges several files (MergeLists).
	Source string
	Line   int
}

// Row names the row for messages: "FILE line N".
func (e Entry) Row() string { return fmt.Sprintf("%s line %d", e.Source, e.Line) }

// List is a parsed rack manifest, or several merged into one (one file per rack).
type List struct {
	// Sources are the files the entries come from, in order; Source names them all
	// for messages (the file, or "a.csv, b.csv").
	Sources  []string
	Source   string
	Entries  []Entry
	bySerial map[string]int
	byMAC    map[string]int
	byEK     map[string]int
}

// manifestColumns are the columns a manifest may have; serial and/or mac are required.
var manifestColumns = []string{"serial", "mac", "rack", "slot", "ekhash", "ekcertificate", "bmc"}

// maxEKCertificatePEM bounds one ekCertificate field (an EK certificate is 1 to 2 KB).
const maxEKCertificatePEM = 16 << 10

// LoadList reads the rack manifest at path (see ParseList).
func LoadList(path string) (*List, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allowlist: %w", err)
	}
	defer f.Close()
	return ParseList(path, f)
}

// ParseList parses a rack manifest: CSV with a header row naming its columns, from
// serial, mac, rack, slot, ekHash, ekCertificate and bmc (any order, case-insensitive;
// serial and/or mac required). ekHash is "sha256:HEX" (see Entry.EKHash); upper-case
// hex is accepted. ekCertificate is the TPM's EK certificate as the vendor supplies it,
// PEM (in a quoted field, since it spans lines); it gives the row's ekHash, and a row
// with both must name the same key. bmc is the machine's BMC Redfish address,
// https://host[:port], without a user or password (see Entry.BMC).
// Lines starting with '#' and blank lines are skipped. MACs are normalised as in
// CONTRACTS §1; a placeholder serial ("To Be Filled By O.E.M.") is an error, since it
// would match any machine with the same placeholder. A serial or MAC listed twice is an
// error. Errors name the source and line.
func ParseList(source string, r io.Reader) (*List, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("allowlist %s: empty: the first line must name the columns (%s)", source, strings.Join(manifestColumns, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("allowlist %s: %w", source, err)
	}
	col, err := manifestHeader(header)
	if err != nil {
		return nil, fmt.Errorf("allowlist %s line 1: %w", source, err)
	}
	l := newList(source)
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("allowlist %s: %w", source, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != len(header) {
			return nil, fmt.Errorf("allowlist %s line %d: %d fields, the header has %d", source, line, len(rec), len(header))
		}
		e, err := manifestEntry(rec, col, line)
		e.Source = source
		if err == nil {
			err = l.add(e)
		}
		if err != nil {
			return nil, fmt.Errorf("allowlist %s line %d: %w", source, line, err)
		}
	}
	return l, nil
}

// manifestHeader returns the index of each column the header names.
func manifestHeader(header []string) (map[string]int, error) {
	col := map[string]int{}
	for i, h := range header {
		h = strings.ToLower(strings.TrimSpace(h))
		known := false
		for _, c := range manifestColumns {
			known = known || c == h
		}
		if !known {
			return nil, fmt.Errorf("unknown column %q: columns are %s (serial and/or mac required)", header[i], strings.Join(manifestColumns, ", "))
		}
		if _, dup := col[h]; dup {
			return nil, fmt.Errorf("column %q appears twice", h)
		}
		col[h] = i
	}
	_, hasSerial := col["serial"]
	_, hasMAC := col["mac"]
	if !hasSerial && !hasMAC {
		return nil, errors.New("no serial or mac column: the header must name at least one of them")
	}
	return col, nil
}

// manifestEntry parses one row, normalising its serial, MAC and EK.
func manifestEntry(rec []string, col map[string]int, line int) (Entry, error) {
	get := func(name string) string {
		if i, ok := col[name]; ok {
			return strings.TrimSpace(rec[i])
		}
		return ""
	}
	e := Entry{Rack: get("rack"), Slot: get("slot"), Line: line}
	if raw := get("serial"); raw != "" {
		s, err := identity.NormalizeSerial(raw)
		if err != nil {
			return Entry{}, fmt.Errorf("serial %q: %w", raw, err)
		}
		if s == "" {
			return Entry{}, fmt.Errorf("serial %q is a placeholder that many machines share; list the MAC instead", raw)
		}
		e.Serial = s
	}
	if raw := get("mac"); raw != "" {
		m, err := identity.NormalizeMAC(raw)
		if err != nil {
			return Entry{}, err
		}
		e.MAC = strings.ToLower(m.String())
	}
	if e.Serial == "" && e.MAC == "" {
		return Entry{}, errors.New("neither serial nor mac is set")
	}
	if raw := get("ekhash"); raw != "" {
		h, err := NormalizeEKHash(raw)
		if err != nil {
			return Entry{}, err
		}
		e.EKHash = h
	}
	if raw := get("bmc"); raw != "" {
		a, err := bmc.NormalizeAddress(raw)
		if err != nil {
			return Entry{}, fmt.Errorf("bmc: %w (BMC users and passwords go in bmc-credentials.yaml in gpuboot's state directory, never in the manifest)", err)
		}
		e.BMC = a
	}
	if raw := get("ekcertificate"); raw != "" {
		h, err := EKHashOfCertificatePEM(raw)
		if err != nil {
			return Entry{}, fmt.Errorf("ekCertificate: %w", err)
		}
		if e.EKHash != "" && e.EKHash != h {
			return Entry{}, fmt.Errorf("ekHash %s and the ekCertificate's key (%s) differ: give the one the vendor shipped for this machine", e.EKHash, h)
		}
		e.EKHash = h
	}
	return e, nil
}

func newList(sources ...string) *List {
	return &List{Sources: sources, Source: strings.Join(sources, ", "),
		bySerial: map[string]int{}, byMAC: map[string]int{}, byEK: map[string]int{}}
}

// add appends e, refusing a serial, EK or MAC another row already lists.
func (l *List) add(e Entry) error {
	idx := len(l.Entries)
	if e.Serial != "" {
		if prev, dup := l.bySerial[e.Serial]; dup {
			return fmt.Errorf("serial %q already listed %s", e.Serial, l.where(prev, e))
		}
	}
	if e.EKHash != "" {
		if prev, dup := l.byEK[e.EKHash]; dup {
			return fmt.Errorf("ekHash %s already listed %s: one TPM is in one machine", e.EKHash, l.where(prev, e))
		}
	}
	if e.MAC != "" {
		if prev, dup := l.byMAC[e.MAC]; dup {
			return fmt.Errorf("mac %s already listed %s", e.MAC, l.where(prev, e))
		}
	}
	if e.Serial != "" {
		l.bySerial[e.Serial] = idx
	}
	if e.EKHash != "" {
		l.byEK[e.EKHash] = idx
	}
	if e.MAC != "" {
		l.byMAC[e.MAC] = idx
	}
	l.Entries = append(l.Entries, e)
	return nil
}

// Match returns the entry for the identity c: one whose every given field (serial, MAC)
// equals c's.
func (l *List) Match(c identity.Identity) (Entry, bool) {
	if l == nil {
		return Entry{}, false
	}
	try := func(idx int, ok bool) (Entry, bool) {
		if !ok {
			return Entry{}, false
		}
		e := l.Entries[idx]
		if e.Serial != "" && e.Serial != c.Serial {
			return Entry{}, false
		}
		if e.MAC != "" && e.MAC != c.MAC {
			return Entry{}, false
		}
		return e, true
	}
	if c.Serial != "" {
		if e, ok := try(l.bySerial[c.Serial], hasKey(l.bySerial, c.Serial)); ok {
			return e, true
		}
	}
	if c.MAC != "" {
		return try(l.byMAC[c.MAC], hasKey(l.byMAC, c.MAC))
	}
	return Entry{}, false
}

func hasKey(m map[string]int, k string) bool { _, ok := m[k]; return ok }

// where says where the entry at index prev is, as seen from e: "on line 3" in the
// same file, "in rack-r1.csv line 3" in another.
func (l *List) where(prev int, e Entry) string {
	p := l.Entries[prev]
	if p.Source == e.Source {
		return fmt.Sprintf("on line %d", p.Line)
	}
	return "in " + p.Row()
}

// LoadLists reads the rack manifests at paths (one per rack, as the vendor shipped
// them; see ParseList) and merges them into one List (see MergeLists). Every file is
// read, and the error names every file that does not parse.
func LoadLists(paths ...string) (*List, error) {
	if len(paths) == 0 {
		return nil, errors.New("allowlist: no manifest file given")
	}
	lists := make([]*List, 0, len(paths))
	var errs []error
	for _, p := range paths {
		l, err := LoadList(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		lists = append(lists, l)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return MergeLists(lists...)
}

// MergeLists merges parsed manifests into one List. Each entry keeps its Source and
// Line. A serial, MAC or EK hash listed in two of them is an error naming both files
// and lines (one machine has one row); the error lists every such row. A file given
// twice is an error too. The lists are not changed.
func MergeLists(lists ...*List) (*List, error) {
	var sources []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, s := range l.Sources {
			if seen[s] {
				return nil, fmt.Errorf("allowlist %s is given twice: list each rack manifest once", s)
			}
			seen[s] = true
			sources = append(sources, s)
		}
	}
	m := newList(sources...)
	var errs []error
	for _, l := range lists {
		for _, e := range l.Entries {
			if err := m.add(e); err != nil {
				errs = append(errs, fmt.Errorf("allowlist %s: %w", e.Row(), err))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// ParseListBytes is ParseList over a byte slice.
func ParseListBytes(source string, b []byte) (*List, error) {
	return ParseList(source, bytes.NewReader(b))
}

// EKHashOfCertificatePEM returns the EK hash ("sha256:HEX", see Entry.EKHash) of the
// public key of the one X.509 certificate in the PEM text s.
func EKHashOfCertificatePEM(s string) (string, error) {
	if len(s) > maxEKCertificatePEM {
		return "", fmt.Errorf("%d bytes, more than %d: not one EK certificate", len(s), maxEKCertificatePEM)
	}
	block, rest := pem.Decode([]byte(s))
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New(`want one PEM "CERTIFICATE" block (-----BEGIN CERTIFICATE----- …), quoted in the CSV since it spans lines`)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return "", errors.New("text after the certificate: give one certificate per row")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("not an X.509 certificate: %v", err)
	}
	return ekHashOfKey(cert.PublicKey)
}

// ekHashOfKey hashes the DER SubjectPublicKeyInfo of pub as gpuboot does for the EK a
// TPM proves (re-encoded, so equal keys hash the same whatever encoding carried them).
func ekHashOfKey(pub any) (string, error) {
	switch pub.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey:
	default:
		return "", fmt.Errorf("public key of type %T: a TPM EK is RSA or ECC", pub)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// NormalizeEKHash checks an EK hash in the form "sha256:" plus 64 hex digits and returns
// it with the hex in lower case.
func NormalizeEKHash(s string) (string, error) {
	const prefix = "sha256:"
	if len(s) != len(prefix)+64 || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", fmt.Errorf("ekHash %q: want sha256: and 64 hex digits, the sha256 over the DER SubjectPublicKeyInfo of the EK public key (for an EK certificate: openssl x509 -in ek.pem -pubkey -noout | openssl pkey -pubin -outform DER | sha256sum)", s)
	}
	h := strings.ToLower(s[len(prefix):])
	if _, err := hex.DecodeString(h); err != nil {
		return "", fmt.Errorf("ekHash %q: not hex: %v", s, err)
	}
	return prefix + h, nil
}

package bmc

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// CredentialsFile is the name of the BMC accounts file in gpuboot's state directory.
const CredentialsFile = "bmc-credentials.yaml"

// Account is one BMC account: a user, its password, and how to trust the BMCs' TLS
// certificates.
type Account struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// Insecure accepts any certificate (BMCs ship self-signed ones); CA is the PEM
	// the BMCs' certificates chain to instead.
	Insecure bool   `yaml:"insecure,omitempty"`
	CA       string `yaml:"ca,omitempty"`
}

// Credentials are gpuboot's BMC accounts (STATEDIR/bmc-credentials.yaml): one per rack,
// and a default for racks without their own. They are never in the rack manifest,
// which names only each machine's BMC address.
//
//	default:
//	  username: admin
//	  password: "…"
//	  insecure: true
//	racks:
//	  r1:
//	    username: root
//	    password: "…"
//	    ca: |
//	      -----BEGIN CERTIFICATE-----
//	      …
type Credentials struct {
	Default *Account           `yaml:"default,omitempty"`
	Racks   map[string]Account `yaml:"racks,omitempty"`
	// source names the file, for messages.
	source string
}

// LoadCredentials reads the accounts file at path. The file must not be readable by
// group or others (it holds passwords): mode 0600. A missing file is an error wrapping
// fs.ErrNotExist.
func LoadCredentials(path string) (*Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("BMC credentials: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("BMC credentials: %w", err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("BMC credentials %s: mode %04o lets others read the BMC passwords: chmod 600 %s", path, perm, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("BMC credentials: %w", err)
	}
	return ParseCredentials(path, data)
}

// ParseCredentials parses an accounts file's content; source names it in errors, which
// say where the problem is. Every account needs a username and a password, and a CA
// that is PEM certificates.
func ParseCredentials(source string, data []byte) (*Credentials, error) {
	c := &Credentials{source: source}
	pos, err := strictyaml.Decode(source, data, c)
	if err != nil {
		return nil, fmt.Errorf("BMC credentials: %w", err)
	}
	var errs strictyaml.Errors
	check := func(field string, a Account) {
		switch {
		case a.Username == "":
			errs = append(errs, pos.At(source, field+".username", "is required"))
		case a.Password == "":
			errs = append(errs, pos.At(source, field+".password", "is required"))
		}
		if a.CA != "" && !validPEM(a.CA) {
			errs = append(errs, pos.At(source, field+".ca", "is not PEM certificates (-----BEGIN CERTIFICATE-----)"))
		}
	}
	if c.Default != nil {
		check("default", *c.Default)
	}
	racks := make([]string, 0, len(c.Racks))
	for r := range c.Racks {
		racks = append(racks, r)
	}
	slices.Sort(racks)
	for _, r := range racks {
		check("racks["+r+"]", c.Racks[r])
	}
	if c.Default == nil && len(c.Racks) == 0 {
		errs = append(errs, pos.At(source, "", "names no account: give default, or racks.NAME, with username and password"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("BMC credentials: %w", errs)
	}
	return c, nil
}

// validPEM reports whether s holds PEM certificates only, at least one, each parsable.
func validPEM(s string) bool {
	rest, n := []byte(s), 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return n > 0 && strings.TrimSpace(string(rest)) == ""
		}
		if b.Type != "CERTIFICATE" {
			return false
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return false
		}
		n++
	}
}

// ErrNoCredentials is wrapped by Endpoint when no account applies.
var ErrNoCredentials = errors.New("no BMC credentials")

// Endpoint is the Endpoint for the BMC at address of a machine in rack: the rack's
// account, else the default. c may be nil (no file): that is ErrNoCredentials.
func (c *Credentials) Endpoint(address, rack string) (Endpoint, error) {
	if c == nil {
		return Endpoint{}, fmt.Errorf("%w: gpuboot has no %s in its state directory: create it (mode 0600) with a default account or one for rack %q, and restart gpuboot", ErrNoCredentials, CredentialsFile, rack)
	}
	a, where := c.Default, "default account"
	if ra, ok := c.Racks[rack]; ok {
		a, where = &ra, fmt.Sprintf("rack %s", rack)
	}
	if a == nil {
		return Endpoint{}, fmt.Errorf("%w for rack %q in %s, and no default account: add racks.%s or default", ErrNoCredentials, rack, c.source, rack)
	}
	return Endpoint{Address: address, Username: a.Username, Password: a.Password, Insecure: a.Insecure, CAPEM: []byte(a.CA),
		CredentialsSource: c.source + ", " + where}, nil
}

// IsNotExist reports whether LoadCredentials failed because the file is missing.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

package server

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// File names of gpuboot's serving certificate in STATEDIR/pki.
const (
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
)

// serverHosts are the names every server certificate carries besides the advertised
// ones: the operator CLI on gpuboot's own host dials localhost.
var serverHosts = []string{"localhost", "127.0.0.1"}

// ReissueServer issues gpuboot's serving certificate again from the gpurack CA under
// stateDir, for advertise (host names and IP addresses) plus localhost and 127.0.0.1 as
// `gpuboot init` does, and replaces pki/server.crt and pki/server.key. The CA is loaded
// and the certificate made before anything is written, so a missing or unreadable CA
// (the error names the file) leaves the old pair in place; each file is then replaced
// whole (atomicfile). A running `gpuboot serve` takes the new pair for new connections
// within a second.
func ReissueServer(stateDir string, advertise []string) (*x509.Certificate, error) {
	if len(advertise) == 0 {
		return nil, errors.New("reissue server certificate: --advertise is required: the host names and IP addresses machines reach gpuboot at")
	}
	pkiDir := filepath.Join(stateDir, "pki")
	ca, err := pki.LoadCA(pkiDir)
	if err != nil {
		return nil, fmt.Errorf("reissue server certificate: %w", err)
	}
	kp, err := pki.IssueServer(ca, append(append([]string(nil), advertise...), serverHosts...))
	if err != nil {
		return nil, err
	}
	if err := pki.SaveKeyPair(filepath.Join(pkiDir, ServerCertFile), filepath.Join(pkiDir, ServerKeyFile), kp); err != nil {
		return nil, fmt.Errorf("reissue server certificate: %w", err)
	}
	return kp.Cert, nil
}

// RenewOperator issues the operator name a new certificate at the level of its current
// one, read from outDir/operator.crt, and replaces outDir's credentials (IssueOperator).
// The old certificate stays valid until it expires unless it is revoked (`gpuboot certs
// revoke operator NAME --serial HEX`). It returns the old and the new certificate.
func RenewOperator(stateDir, name, outDir string) (old, renewed *x509.Certificate, err error) {
	certPath := filepath.Join(outDir, OperatorCertFile)
	data, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("renew operator %s: %s does not exist: renew reads the level from the current certificate; issue a first one with `gpuboot certs operator %s --level LEVEL`, or give --out DIR holding it", name, certPath, name)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("renew operator %s: %w", name, err)
	}
	old, err = pki.DecodeCertPEM(data)
	if err != nil {
		return nil, nil, fmt.Errorf("renew operator %s: %s: %w", name, certPath, err)
	}
	if old.Subject.CommonName != name {
		return nil, nil, fmt.Errorf("renew operator %s: %s is operator %q's certificate, not %q: give the right NAME or --out DIR", name, certPath, old.Subject.CommonName, name)
	}
	level := pki.OperatorLevelOf(old)
	if level == "" {
		return nil, nil, fmt.Errorf("renew operator %s: %s is not an operator certificate with one level: issue one with `gpuboot certs operator %s --level LEVEL`", name, certPath, name)
	}
	if renewed, err = issueOperator(stateDir, name, level, outDir); err != nil {
		return nil, nil, fmt.Errorf("renew operator %s: %w", name, err)
	}
	return old, renewed, nil
}

// CertificateExpiry is one certificate `gpuboot certs check-expiration` reports.
type CertificateExpiry struct {
	// Name is "ca", "server" or "operator/NAME".
	Name string `json:"name"`
	File string `json:"file"`
	// Subject is the certificate's CN; Level an operator's level.
	Subject  string    `json:"subject"`
	Level    string    `json:"level,omitempty"`
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"notAfter"`
	// Residual is NotAfter less the time of the check (negative once expired), in
	// seconds.
	Residual float64 `json:"residualSeconds"`
	// Revoked is set when the serial is on gpuboot's revocation list.
	Revoked bool `json:"revoked,omitempty"`
	// Error says why the file could not be read (the other fields are then empty).
	Error string `json:"error,omitempty"`
}

// CertificateExpiries lists the gpurack CA, the server certificate and every operator
// certificate under stateDir/operators (STATEDIR/operators/NAME/operator.crt) with
// their expiry as of now. A certificate that cannot be read is listed with its error;
// a missing CA is an error.
func CertificateExpiries(stateDir string, now time.Time) ([]CertificateExpiry, error) {
	pkiDir := filepath.Join(stateDir, "pki")
	caPath := filepath.Join(pkiDir, pki.CACertFile)
	if _, err := os.Stat(caPath); err != nil {
		return nil, fmt.Errorf("check expiration: %w: point --state-dir at gpuboot's state directory (where `gpuboot init` made pki/%s)", err, pki.CACertFile)
	}
	revoked := pki.NewRevocationList()
	if _, err := os.Stat(filepath.Join(pkiDir, "revoked.json")); err == nil {
		if revoked, err = pki.LoadRevocationList(filepath.Join(pkiDir, "revoked.json")); err != nil {
			return nil, fmt.Errorf("check expiration: %w", err)
		}
	}
	out := []CertificateExpiry{expiryOf("ca", caPath, now, revoked), expiryOf("server", filepath.Join(pkiDir, ServerCertFile), now, revoked)}
	dirs, err := os.ReadDir(filepath.Join(stateDir, "operators"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("check expiration: %w", err)
	}
	var ops []CertificateExpiry
	for _, d := range dirs {
		p := filepath.Join(stateDir, "operators", d.Name(), OperatorCertFile)
		if _, err := os.Stat(p); !d.IsDir() || err != nil {
			continue
		}
		ops = append(ops, expiryOf("operator/"+d.Name(), p, now, revoked))
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].Name < ops[j].Name })
	return append(out, ops...), nil
}

func expiryOf(name, path string, now time.Time, revoked *pki.RevocationList) CertificateExpiry {
	e := CertificateExpiry{Name: name, File: path}
	data, err := os.ReadFile(path)
	if err != nil {
		e.Error = err.Error()
		return e
	}
	cert, err := pki.DecodeCertPEM(data)
	if err != nil {
		e.Error = fmt.Sprintf("%s: %v", path, err)
		return e
	}
	e.Subject, e.Serial, e.NotAfter = cert.Subject.CommonName, cert.SerialNumber.Text(16), cert.NotAfter.UTC()
	e.Residual = cert.NotAfter.Sub(now).Seconds()
	e.Revoked = revoked.Contains(cert.SerialNumber)
	if l := pki.OperatorLevelOf(cert); l != "" {
		e.Level = l.Name()
	}
	return e
}

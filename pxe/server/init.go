package server

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/adminclient"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// Files of an operator credentials directory (`gpuboot certs operator NAME --out DIR`);
// pxe/adminclient reads them.
const (
	OperatorCAFile   = adminclient.CAFile
	OperatorCertFile = adminclient.CertFile
	OperatorKeyFile  = adminclient.KeyFile
)

// OperatorTLS is adminclient.OperatorTLS, for the callers that reach a node's agent with
// the operator credentials.
func OperatorTLS(dir string) (*tls.Config, error) { return adminclient.OperatorTLS(dir) }

// InitOptions are `gpuboot init`'s inputs.
type InitOptions struct {
	StateDir string
	// Advertise lists the host names and IP addresses agents and operators reach
	// gpuboot at; they become the server certificate's SANs (localhost and 127.0.0.1
	// are added for the operator CLI on the server itself).
	Advertise []string
	// Racks get a gossip key each.
	Racks []string
	// Operator names the first operator certificate (level admin).
	Operator string
}

// InitResult says what Init wrote.
type InitResult struct {
	CAPin       string
	OperatorDir string
	GossipKeys  []string
	ServerCert  string
}

// Init creates gpuboot's state directory (CONTRACTS §4): the gpurack CA, the server
// certificate (role gpurack:servers), a gossip key per rack and a first operator
// certificate, an admin's (the level that may revoke operators). It refuses to replace an existing CA.
func Init(o InitOptions) (*InitResult, error) {
	if o.StateDir == "" {
		return nil, errors.New("init: --state-dir is required")
	}
	if len(o.Advertise) == 0 {
		return nil, errors.New("init: --advertise is required: the host names and IP addresses machines reach gpuboot at")
	}
	if o.Operator == "" {
		o.Operator = "admin"
	}
	pkiDir := filepath.Join(o.StateDir, "pki")
	if _, err := os.Stat(filepath.Join(pkiDir, pki.CACertFile)); err == nil {
		return nil, fmt.Errorf("init: %s already holds a gpurack CA; gpuboot init runs once (issue operators with `gpuboot certs operator NAME`)", pkiDir)
	}
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack CA", Organizations: []string{"gpurack"}})
	if err != nil {
		return nil, err
	}
	if err := pki.SaveCA(pkiDir, ca); err != nil {
		return nil, err
	}
	hosts := append(append([]string(nil), o.Advertise...), "localhost", "127.0.0.1")
	server, err := pki.IssueServer(ca, hosts)
	if err != nil {
		return nil, err
	}
	res := &InitResult{CAPin: ca.Pin(), ServerCert: filepath.Join(pkiDir, "server.crt")}
	if err := pki.SaveKeyPair(res.ServerCert, filepath.Join(pkiDir, "server.key"), server); err != nil {
		return nil, err
	}
	if err := (pki.NewRevocationList()).Save(filepath.Join(pkiDir, "revoked.json")); err != nil {
		return nil, err
	}
	for _, r := range o.Racks {
		p, _, err := EnsureGossipKey(o.StateDir, r)
		if err != nil {
			return nil, err
		}
		res.GossipKeys = append(res.GossipKeys, p)
	}
	res.OperatorDir = filepath.Join(o.StateDir, "operators", o.Operator)
	if err := IssueOperator(o.StateDir, o.Operator, pki.LevelAdmin, res.OperatorDir); err != nil {
		return nil, err
	}
	return res, nil
}

// EnsureGossipKey returns the path of rack's gossip key ring under stateDir and the key
// agents encrypt with, creating a ring of one 32-byte key (mode 0600) if there is none.
// `gpuboot gossip rotate` changes the ring while gpuboot runs (enroll.GossipRing).
func EnsureGossipKey(stateDir, rack string) (string, []byte, error) {
	if rack == "" || strings.ContainsAny(rack, "/\\.") {
		return "", nil, fmt.Errorf("gossip key: rack name %q", rack)
	}
	dir := filepath.Join(stateDir, "gossip")
	p := filepath.Join(dir, rack+".key")
	if b, err := os.ReadFile(p); err == nil {
		ring, err := enroll.ParseGossipRing(b)
		if err != nil {
			return "", nil, fmt.Errorf("%s: %w", p, err)
		}
		return p, ring.Primary, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", nil, err
	}
	// Written whole and linked into place (never replacing a key another
	// start wrote meanwhile), so no reader sees a partial key.
	if err := atomicfile.Create(p, enroll.GossipRing{Primary: key}.Marshal(rack), 0o600); err != nil {
		if _, statErr := os.Stat(p); statErr == nil {
			return EnsureGossipKey(stateDir, rack)
		}
		return "", nil, fmt.Errorf("gossip key: %w", err)
	}
	return p, key, nil
}

// IssueOperator issues an operator certificate for name at level from the CA under
// stateDir, records it (with its level) for `gpuboot operators revoke`, and writes
// outDir/{ca.crt,operator.crt,operator.key}.
func IssueOperator(stateDir, name string, level pki.OperatorLevel, outDir string) error {
	_, err := issueOperator(stateDir, name, level, outDir)
	return err
}

// issueOperator is IssueOperator, returning the certificate. The CA is loaded and the
// certificate made before anything is written (a missing CA key writes nothing), and
// each file is replaced whole.
func issueOperator(stateDir, name string, level pki.OperatorLevel, outDir string) (*x509.Certificate, error) {
	ca, err := pki.LoadCA(filepath.Join(stateDir, "pki"))
	if err != nil {
		return nil, err
	}
	kp, err := pki.IssueOperatorLevel(ca, name, level)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(outDir, OperatorCAFile), pki.EncodeCertPEM(ca.Cert), 0o644); err != nil {
		return nil, err
	}
	if err := recordOperatorCert(stateDir, name, kp.Cert.SerialNumber.Text(16), kp.Cert.NotAfter, level); err != nil {
		return nil, fmt.Errorf("record the operator certificate (for gpuboot operators revoke): %w", err)
	}
	if err := pki.SaveKeyPair(filepath.Join(outDir, OperatorCertFile), filepath.Join(outDir, OperatorKeyFile), kp); err != nil {
		return nil, err
	}
	return kp.Cert, nil
}

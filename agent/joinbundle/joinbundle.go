// Package joinbundle reads the JoinBundle gpuboot hands an approved machine
// (CONTRACTS §4; gpurack.boot.v1.JoinBundle, protojson when it is a file) and builds the
// agent's mutual-TLS configuration from it. It does not enroll (that is gpuboot's
// protocol) and does not touch kubelet.
package joinbundle

import (
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// DefaultKeyDir is where the agent keeps its enrollment key (tmpfs, CONTRACTS §2).
const DefaultKeyDir = "/run/gpurack"

// Load reads and checks a protojson JoinBundle file.
func Load(path string, now time.Time) (*bootv1.JoinBundle, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("join bundle: %w", err)
	}
	var b bootv1.JoinBundle
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("join bundle %s: not a protojson gpurack.boot.v1.JoinBundle: %w", path, err)
	}
	switch {
	case b.GetNodeName() == "":
		return nil, fmt.Errorf("join bundle %s: node_name is empty", path)
	case b.GetAgentCertificatePem() == "" || b.GetGpurackCaPem() == "":
		return nil, fmt.Errorf("join bundle %s: agent_certificate_pem and gpurack_ca_pem are required for the agent's TLS", path)
	case b.GetExpiresAt() != nil && now.After(b.GetExpiresAt().AsTime()) && b.GetBootstrapToken() != "":
		return nil, fmt.Errorf("join bundle %s: expired at %s; ask gpuboot for a new one", path, b.GetExpiresAt().AsTime().Format(time.RFC3339))
	}
	if g := b.GetGossip(); g != nil && len(g.GetKey()) != 0 {
		switch len(g.GetKey()) {
		case 16, 24, 32:
		default:
			return nil, fmt.Errorf("join bundle %s: gossip key is %d bytes; memberlist needs 16, 24 or 32", path, len(g.GetKey()))
		}
	}
	return &b, nil
}

// Credentials are the agent's certificate, key and the gpurack CA. Cert is the
// certificate the bundle brought; Renew replaces it while the agent runs, and Current,
// GetCertificate and GetClientCertificate give the one in use.
type Credentials struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	CA   *x509.Certificate

	renewed atomic.Pointer[x509.Certificate]
}

// LoadCredentials resolves the bundle's agent_key_ref ("file:PATH", or "sha256:HEX"
// naming the enrollment key in keyDir/agent.key) and checks that the key is the
// certificate's.
func LoadCredentials(b *bootv1.JoinBundle, keyDir string) (*Credentials, error) {
	cert, err := pki.DecodeCertPEM([]byte(b.GetAgentCertificatePem()))
	if err != nil {
		return nil, fmt.Errorf("join bundle agent certificate: %w", err)
	}
	ca, err := pki.DecodeCertPEM([]byte(b.GetGpurackCaPem()))
	if err != nil {
		return nil, fmt.Errorf("join bundle gpurack CA: %w", err)
	}
	ref := b.GetAgentKeyRef()
	var keyPath string
	switch {
	case strings.HasPrefix(ref, "file:"):
		keyPath = strings.TrimPrefix(ref, "file:")
	case strings.HasPrefix(ref, "sha256:"):
		keyPath = filepath.Join(keyDir, "agent.key")
	default:
		return nil, fmt.Errorf("join bundle agent_key_ref %q: want file:PATH or sha256:HEX", ref)
	}
	data, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("agent key: %w", err)
	}
	key, err := pki.DecodeKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("agent key %s: %w", keyPath, err)
	}
	if strings.HasPrefix(ref, "sha256:") {
		der, err := x509.MarshalPKIXPublicKey(key.Public())
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(der)
		if got := "sha256:" + hex.EncodeToString(sum[:]); !strings.EqualFold(got, ref) {
			return nil, fmt.Errorf("join bundle is for key %s, this agent's key is %s: the bundle belongs to another registration", ref, got)
		}
	}
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(key.Public()) {
		return nil, fmt.Errorf("join bundle agent certificate does not hold the agent's public key")
	}
	// The chain is checked as of the certificate's last valid moment: an agent restarted
	// after its certificate expired still uses its kept bundle and renews at once with
	// its key (CONTRACTS §2.10), rather than enrolling again for a bundle gpuboot
	// releases once.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: cert.NotAfter}); err != nil {
		return nil, fmt.Errorf("join bundle agent certificate is not issued by its gpurack CA: %w", err)
	}
	return &Credentials{Cert: cert, Key: key, CA: ca}, nil
}

func pool(ca *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// ServerTLS is mutual TLS for the agent's gRPC port: the agent certificate, and a
// client certificate from the gpurack CA required whose role is an operator's (CONTRACTS
// §4; gpuboot's certificate is serverAuth only and cannot be a client's). Another node's
// agent certificate is refused: it is signed by the same CA, but a node must not drive
// another node's agent (InjectFault, RunChecks). A certificate on revoked (gpuboot's
// revocation list, which heartbeat answers bring; nil: none) is refused too.
//
// These checks run once, when a connection opens; the connection then lives on. The
// gRPC server checks every call again (agent/server.Guard: the list as it is now and
// the operator level each method needs) and ends open streams a new list revokes.
func (c *Credentials) ServerTLS(revoked *pki.RevocationList) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      pool(c.CA),
		NextProtos:     []string{"h2"},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if revoked != nil {
				if err := revoked.VerifyConnection(cs); err != nil {
					return err
				}
			}
			return pki.PeerHasRole(cs, pki.RoleOperators)
		},
	}
}

// KeptFile is the name, in the key directory, of the bundle the agent keeps.
const KeptFile = "joinbundle.json"

// Keep stores b in keyDir (mode 0600, atomically) beside the enrollment key. gpuboot
// releases a bundle once per key (Register then answers BUNDLE_RELEASED), so an agent
// that systemd restarts must find it again. keyDir is tmpfs (/run/gpurack): a reboot
// loses both, makes a new key and enrolls again (CONTRACTS §2.8).
func Keep(b *bootv1.JoinBundle, keyDir string) error {
	data, err := protojson.Marshal(b)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(keyDir, KeptFile), data, 0o600)
}

// Kept returns the bundle kept in keyDir and its credentials when it belongs to the
// key there, or nil and the reason it cannot be used (none kept, another key's, not
// readable). The bootstrap token's expiry does not matter here: kubelet holds its own
// credentials by then.
func Kept(keyDir string) (*bootv1.JoinBundle, *Credentials, error) {
	path := filepath.Join(keyDir, KeptFile)
	b, err := Load(path, time.Time{})
	if err != nil {
		return nil, nil, err
	}
	creds, err := LoadCredentials(b, keyDir)
	if err != nil {
		return nil, nil, fmt.Errorf("kept join bundle %s: %w", path, err)
	}
	return b, creds, nil
}

package joinbundle

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

func fixture(t *testing.T) (*bootv1.JoinBundle, string, *pki.KeyPair) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.IssueAgent(ca, "node-a", []net.IP{net.ParseIP("10.0.0.5")})
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dir, "agent.key")
	if err := pki.SaveKeyPair(filepath.Join(dir, "agent.pem"), keyPath, kp); err != nil {
		t.Fatal(err)
	}
	b := &bootv1.JoinBundle{NodeName: "node-a", AgentCertificatePem: string(pki.EncodeCertPEM(kp.Cert)), AgentKeyRef: "file:" + keyPath,
		GpurackCaPem: string(pki.EncodeCertPEM(ca.Cert)), BootstrapToken: "abcdef.0123456789abcdef",
		ExpiresAt: timestamppb.New(time.Now().Add(15 * time.Minute)), Gossip: &bootv1.GossipConfig{Key: make([]byte, 16), Rack: "r1"}}
	return b, dir, kp
}

func write(t *testing.T, dir string, b *bootv1.JoinBundle) string {
	data, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "bundle.json")
	os.WriteFile(p, data, 0o600)
	return p
}

func TestLoadAndCredentials(t *testing.T) {
	b, dir, kp := fixture(t)
	got, err := Load(write(t, dir, b), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	creds, err := LoadCredentials(got, dir)
	if err != nil {
		t.Fatal(err)
	}
	conf := creds.ServerTLS(nil)
	if conf.ClientAuth.String() != "RequireAndVerifyClientCert" || conf.GetCertificate == nil {
		t.Errorf("TLS config %+v", conf)
	} else if c, err := conf.GetCertificate(nil); err != nil || !c.Leaf.Equal(kp.Cert) {
		t.Errorf("GetCertificate = %v, %v; want the bundle's certificate", c, err)
	}
	// sha256: refs name the enrollment key in the key directory.
	der, _ := x509.MarshalPKIXPublicKey(kp.Key.Public())
	sum := sha256.Sum256(der)
	got.AgentKeyRef = "sha256:" + hex.EncodeToString(sum[:])
	if _, err := LoadCredentials(got, dir); err != nil {
		t.Errorf("sha256 ref: %v", err)
	}
	got.AgentKeyRef = "sha256:" + strings.Repeat("0", 64)
	if _, err := LoadCredentials(got, dir); err == nil || !strings.Contains(err.Error(), "another registration") {
		t.Errorf("foreign fingerprint: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	b, dir, _ := fixture(t)
	cases := []struct {
		mutate func(*bootv1.JoinBundle)
		want   string
	}{
		{func(b *bootv1.JoinBundle) { b.NodeName = "" }, "node_name"},
		{func(b *bootv1.JoinBundle) { b.ExpiresAt = timestamppb.New(time.Now().Add(-time.Minute)) }, "expired"},
		{func(b *bootv1.JoinBundle) { b.Gossip.Key = make([]byte, 7) }, "gossip key"},
		{func(b *bootv1.JoinBundle) { b.GpurackCaPem = "" }, "required"},
	}
	for _, c := range cases {
		bb := protoClone(t, b)
		c.mutate(bb)
		if _, err := Load(write(t, dir, bb), time.Now()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want error with %q, got %v", c.want, err)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing.json"), time.Now()); err == nil {
		t.Error("missing file accepted")
	}
	os.WriteFile(filepath.Join(dir, "junk.json"), []byte(`{"nodeName": 5}`), 0o600)
	if _, err := Load(filepath.Join(dir, "junk.json"), time.Now()); err == nil || !strings.Contains(err.Error(), "protojson") {
		t.Errorf("junk: %v", err)
	}
	// A key that is not the certificate's.
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pemKey, _ := pki.EncodeKeyPEM(other)
	os.WriteFile(filepath.Join(dir, "other.key"), pemKey, 0o600)
	bb := protoClone(t, b)
	bb.AgentKeyRef = "file:" + filepath.Join(dir, "other.key")
	if _, err := LoadCredentials(bb, dir); err == nil || !strings.Contains(err.Error(), "public key") {
		t.Errorf("mismatched key: %v", err)
	}
	bb.AgentKeyRef = "vault:agent"
	if _, err := LoadCredentials(bb, dir); err == nil {
		t.Error("unknown key ref accepted")
	}
}

func protoClone(t *testing.T, b *bootv1.JoinBundle) *bootv1.JoinBundle {
	data, _ := protojson.Marshal(b)
	var out bootv1.JoinBundle
	if err := protojson.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// A kept bundle comes back after a restart, even past the bootstrap token's expiry,
// and only for the key it was issued to.
func TestKeepAndKept(t *testing.T) {
	b, dir, kp := fixture(t)
	der, _ := x509.MarshalPKIXPublicKey(kp.Key.Public())
	sum := sha256.Sum256(der)
	b.AgentKeyRef = "sha256:" + hex.EncodeToString(sum[:])
	if _, _, err := Kept(dir); err == nil {
		t.Fatal("Kept found a bundle before any was kept")
	}
	b.ExpiresAt = timestamppb.New(time.Now().Add(-time.Hour))
	if err := Keep(b, dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, KeptFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept file: %v %v", fi, err)
	}
	got, creds, err := Kept(dir)
	if err != nil || got.GetNodeName() != "node-a" || !creds.Cert.Equal(kp.Cert) {
		t.Fatalf("Kept: %v %v", got, err)
	}
	// A new key (the agent made one) makes the kept bundle unusable.
	other, err := pki.IssueAgent(mustCA(t), "node-b", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveKeyPair(filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent.key"), other); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Kept(dir); err == nil || !strings.Contains(err.Error(), "another registration") {
		t.Errorf("kept bundle with another key: %v", err)
	}
}

func mustCA(t *testing.T) *pki.CA {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "other CA"})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

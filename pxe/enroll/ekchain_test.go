package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/agent/attest/attesttest"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/swtpmtest"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// With enrollment.ekRoots (decision 0653) only a TPM whose maker certified its EK is
// believed: a TPM manufactured with an EK certificate from the listed vendor (swtpm_setup
// with swtpm_localca, as a vendor's factory does) proves its EK and waits for approval;
// a software TPM with no certificate, and a TPM certified by another vendor, are
// refused before any challenge, and nothing is stored for them.
func TestEKRootsAdmitOnlyCertifiedTPMs(t *testing.T) {
	vendor, other := swtpmtest.NewVendor(t), swtpmtest.NewVendor(t)
	certified := vendor.StartCertified(t)
	foreign := other.StartCertified(t)
	roots, err := LoadEKRoots([]string{vendor.Root, vendor.Intermediate})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Identity, c.EKRoots = IdentityTPM, roots })

	a := withTPM(e.agent("52:54:00:00:08:01", "SN-EK-A"), attesttest.New(t, certified))
	if len(a.tpm.Attestation().GetEkCertificate()) == 0 {
		t.Fatal("the certified TPM's attestation carries no EK certificate: the agent did not read NV index 0x01c00002")
	}
	a.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(a.facts.GetIdentity().GetBootMac())
	if m := e.machine(a.facts.GetIdentity().GetBootMac()); m.EKHash != ekHashOf(t, a.tpm) || len(m.EKCertificate) == 0 {
		t.Fatalf("approved machine: EK %q (want %q), EK certificate %d bytes", m.EKHash, ekHashOf(t, a.tpm), len(m.EKCertificate))
	}

	for _, c := range []struct {
		name, mac, want string
		tpm             *swtpmtest.TPM
	}{
		{"a software TPM without an EK certificate", "52:54:00:00:08:02", "sent no EK certificate", swtpmtest.Start(t)},
		{"a TPM certified by another vendor", "52:54:00:00:08:03", "does not chain to enrollment.ekRoots", foreign},
	} {
		b := withTPM(e.agent(c.mac, "SN-EK-B"), attesttest.New(t, c.tpm))
		r, err := b.registerTPM(b.tpm.Attestation(), nil)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Register answered %v, %v; want PermissionDenied saying %q", c.name, r, err, c.want)
		}
		if _, err := e.svc.Resolve(context.Background(), c.mac); !errors.Is(err, inventory.ErrNotFound) {
			t.Errorf("%s: a refused TPM left a record (lookup: %v)", c.name, err)
		}
	}
}

// LoadEKRoots says what is wrong with a roots file, naming it.
func TestLoadEKRootsErrors(t *testing.T) {
	dir := t.TempDir()
	root := testCA(t, "Vendor Root", nil)
	inter := testCA(t, "Vendor EK CA", root)
	write := func(name string, blocks ...*pem.Block) string {
		var b []byte
		for _, blk := range blocks {
			b = append(b, pem.EncodeToMemory(blk)...)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("vendor.pem", &pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}, &pem.Block{Type: "CERTIFICATE", Bytes: inter.Raw})
	r, err := LoadEKRoots([]string{good})
	if err != nil || len(r.Roots()) != 1 || r.Roots()[0] != "CN=Vendor Root" {
		t.Fatalf("a root and an intermediate in one file: %v, roots %v", err, r)
	}
	for _, c := range []struct {
		paths []string
		want  string
	}{
		{[]string{filepath.Join(dir, "missing.pem")}, "missing.pem: no such file"},
		{[]string{write("empty.pem")}, "empty.pem holds no PEM certificate"},
		{[]string{write("key.pem", &pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})}, `key.pem: a "PRIVATE KEY" PEM block`},
		{[]string{write("bad.pem", &pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})}, "bad.pem: certificate 1:"},
		{[]string{write("inter.pem", &pem.Block{Type: "CERTIFICATE", Bytes: inter.Raw})}, "no self-signed root"},
	} {
		_, err := LoadEKRoots(c.paths)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "enrollment.ekRoots: ") {
			t.Errorf("LoadEKRoots(%v): %v, want an enrollment.ekRoots error saying %q", c.paths, err, c.want)
		}
	}
}

// testCA makes a CA certificate, self-signed when parent is nil.
func testCA(t testing.TB, name string, parent *x509.Certificate) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	signer, signKey := tmpl, any(key)
	if parent != nil {
		signer, signKey = parent, testCAKeys[parent.Subject.CommonName]
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	testCAKeys[name] = key
	return c
}

var testCAKeys = map[string]any{}

// FuzzEKRootsVerify: an EK certificate is what an unauthenticated agent sends; no
// input panics, and none but a certificate the roots signed verifies.
func FuzzEKRootsVerify(f *testing.F) {
	root := testCA(f, "Fuzz Root", nil)
	inter := testCA(f, "Fuzz EK CA", root)
	dir := f.TempDir()
	p := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o644); err != nil {
		f.Fatal(err)
	}
	roots, err := LoadEKRoots([]string{p})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(inter.Raw)
	f.Add(root.Raw)
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x01})
	f.Fuzz(func(t *testing.T, der []byte) {
		name, err := roots.Verify(der, time.Now())
		if err == nil && name != "CN=Fuzz Root" {
			t.Fatalf("verified to %q", name)
		}
	})
}

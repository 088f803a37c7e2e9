package policy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/pxe/identity"
)

// testEKCertificate returns a certificate PEM for a fresh key and the key's EK hash,
// computed here independently of the code under test.
func testEKCertificate(t testing.TB) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "EK"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	spki, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	sum := sha256.Sum256(spki)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), "sha256:" + hex.EncodeToString(sum[:])
}

func quoted(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// An ekCertificate column (PEM in a quoted CSV field spanning lines) gives the row the
// hash of the certificate's key, and the rows after it keep their line numbers.
func TestEKCertificateColumn(t *testing.T) {
	certA, hashA := testEKCertificate(t)
	certB, hashB := testEKCertificate(t)
	csv := "serial,mac,ekCertificate,ekHash\n" +
		"SN1,52:54:00:00:0e:01," + quoted(certA) + ",\n" +
		"SN2,52:54:00:00:0e:02," + quoted(certB) + "," + strings.ToUpper(hashB[len("sha256:"):]+"") + "\n"
	// The second row's ekHash lacks its prefix: an error, naming the row's line.
	_, err := ParseListBytes("m.csv", []byte(csv))
	line2 := 2 + strings.Count(certA, "\n")
	if err == nil || !strings.Contains(err.Error(), "m.csv line "+itoa(line2+1)) {
		t.Fatalf("bad ekHash after a certificate: %v; want it on line %d", err, line2+1)
	}
	csv = "serial,mac,ekCertificate,ekHash\n" +
		"SN1,52:54:00:00:0e:01," + quoted(certA) + ",\n" +
		"SN2,52:54:00:00:0e:02," + quoted(certB) + "," + strings.Replace(hashB, "sha256:", "SHA256:", 1) + "\n" +
		"SN3,52:54:00:00:0e:03,,\n"
	l, err := ParseListBytes("m.csv", []byte(csv))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		serial, mac, ek string
	}{{"SN1", "52:54:00:00:0e:01", hashA}, {"SN2", "52:54:00:00:0e:02", hashB}, {"SN3", "52:54:00:00:0e:03", ""}} {
		d := (Policy{Mode: Allowlist, List: l}).Decide(identity.Identity{Serial: c.serial, MAC: c.mac})
		if !d.Approve || d.EKHash != c.ek {
			t.Errorf("%s: decision %+v; want approval with EK %q", c.serial, d, c.ek)
		}
	}
	line4 := line2 + 1 + strings.Count(certB, "\n") + 1
	if e, _ := l.Match(identity.Identity{Serial: "SN3", MAC: "52:54:00:00:0e:03"}); e.Line != line4 {
		t.Errorf("SN3 on line %d; want %d", e.Line, line4)
	}
}

func TestEKCertificateErrors(t *testing.T) {
	certA, _ := testEKCertificate(t)
	_, hashB := testEKCertificate(t)
	cases := map[string]string{
		"serial,ekCertificate\nSN1,not a certificate\n":                                                "m.csv line 2: ekCertificate: want one PEM \"CERTIFICATE\" block",
		"serial,ekCertificate\nSN1,\"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\"\n": "m.csv line 2: ekCertificate: not an X.509 certificate",
		"serial,ekCertificate\nSN1," + quoted(certA+certA) + "\n":                                      "text after the certificate",
		"serial,ekCertificate,ekHash\nSN1," + quoted(certA) + "," + hashB + "\n":                       "differ",
		"serial,ekCertificate\nSN1," + quoted(certA) + "\nSN2," + quoted(certA) + "\n":                 "one TPM is in one machine",
		"serial,ekCertificate\nSN1," + quoted(strings.Repeat("A", maxEKCertificatePEM+1)) + "\n":       "not one EK certificate",
	}
	for in, want := range cases {
		_, err := ParseListBytes("m.csv", []byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseList(%.60q…) err = %v, want one containing %q", in, err, want)
		}
	}
}

func itoa(i int) string { return big.NewInt(int64(i)).String() }

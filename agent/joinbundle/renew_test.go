package joinbundle

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestRenewServesNewCertificate: after Renew, a new TLS connection to the agent's API
// (ServerTLS, real handshakes on loopback) gets the renewed certificate, without a new
// listener; certificates for another key, another node or from another CA are refused
// and change nothing.
func TestRenewServesNewCertificate(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	first, err := pki.CertifyAgentFor(ca, "node-a", nil, pub, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	creds := &Credentials{Cert: first, Key: key, CA: ca.Cert}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", creds.ServerTLS(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.(*tls.Conn).Handshake()
			}()
		}
	}()
	op, err := pki.IssueOperatorLevel(ca, "ops", pki.LevelViewer)
	if err != nil {
		t.Fatal(err)
	}
	served := func() *x509.Certificate {
		t.Helper()
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: ca.CertPool(), ServerName: "node-a", NextProtos: []string{"h2"},
			Certificates: []tls.Certificate{op.TLSCertificate()}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	if got := served(); !got.Equal(first) {
		t.Fatalf("served serial %s before renewal, want the bundle's %s", got.SerialNumber.Text(16), first.SerialNumber.Text(16))
	}

	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	otherCA, _ := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	wrongKey, _ := pki.CertifyAgentFor(ca, "node-a", nil, otherPub, time.Hour)
	wrongNode, _ := pki.CertifyAgentFor(ca, "node-b", nil, pub, time.Hour)
	wrongCA, _ := pki.CertifyAgentFor(otherCA, "node-a", nil, pub, time.Hour)
	for _, tc := range []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"another key", wrongKey, "does not hold the agent's public key"},
		{"another node", wrongNode, `for node "node-b"`},
		{"another CA", wrongCA, "not issued by the gpurack CA"},
	} {
		if _, err := creds.Renew(pki.EncodeCertPEM(tc.cert)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Renew error %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := creds.Renew([]byte("not PEM")); err == nil {
		t.Error("Renew took a non-PEM answer")
	}
	if got := served(); !got.Equal(first) {
		t.Fatalf("a refused renewal changed the served certificate to serial %s", got.SerialNumber.Text(16))
	}

	next, err := pki.CertifyAgentFor(ca, "node-a", nil, pub, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := creds.Renew(pki.EncodeCertPEM(next)); err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(next) {
		t.Fatalf("served serial %s after renewal, want the renewed %s", got.SerialNumber.Text(16), next.SerialNumber.Text(16))
	}
	if c, _ := creds.GetClientCertificate(nil); c.Leaf == nil || !c.Leaf.Equal(next) {
		t.Error("GetClientCertificate does not give the renewed certificate")
	}
}

// TestExpiredCertificateNotSent: an expired agent certificate is not offered to
// gpuboot (it would fail the handshake); the agent then signs its calls with its key.
func TestExpiredCertificateNotSent(t *testing.T) {
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := pki.CertifyAgentFor(ca, "node-a", nil, pub, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	creds := &Credentials{Cert: cert, Key: key, CA: ca.Cert}
	if !creds.Valid(time.Now()) {
		t.Fatal("a fresh certificate reads as invalid")
	}
	if creds.Valid(cert.NotAfter.Add(time.Second)) {
		t.Fatal("a certificate past NotAfter reads as valid")
	}
	time.Sleep(time.Until(cert.NotAfter.Add(1100 * time.Millisecond)))
	if c, err := creds.GetClientCertificate(nil); err != nil || len(c.Certificate) != 0 {
		t.Errorf("GetClientCertificate for an expired certificate = %d certificates, %v; want none", len(c.Certificate), err)
	}
}

// FuzzRenew feeds arbitrary answers to Renew: whatever it accepts is a certificate for
// the agent's key and node from its CA; anything else leaves the certificate in use.
func FuzzRenew(f *testing.F) {
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	first, err := pki.CertifyAgentFor(ca, "node-a", nil, pub, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	next, _ := pki.CertifyAgentFor(ca, "node-a", nil, pub, time.Hour)
	f.Add(pki.EncodeCertPEM(next))
	f.Add(pki.EncodeCertPEM(first)[:100])
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		creds := &Credentials{Cert: first, Key: key, CA: ca.Cert}
		cert, err := creds.Renew(data)
		if err != nil {
			if !creds.Current().Equal(first) {
				t.Fatal("a refused answer changed the certificate in use")
			}
			return
		}
		if !creds.Current().Equal(cert) || cert.Subject.CommonName != "node-a" || cert.CheckSignatureFrom(ca.Cert) != nil ||
			!pub.Equal(cert.PublicKey) {
			t.Fatalf("accepted %v", cert.Subject)
		}
	})
}

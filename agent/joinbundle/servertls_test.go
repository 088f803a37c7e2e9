package joinbundle

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// TestServerTLSAdmitsOperatorsOnly runs real TLS handshakes on loopback against the
// agent's server config: an operator's certificate gets in; another node's agent
// certificate, signed by the same gpurack CA, is refused, and so is gpuboot's serving
// certificate (serverAuth only) (CONTRACTS §4), and so is a revoked operator's.
func TestServerTLSAdmitsOperatorsOnly(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	self, err := pki.IssueAgent(ca, "node-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	creds := &Credentials{Cert: self.Cert, Key: self.Key, CA: ca.Cert}
	revoked := pki.NewRevocationList()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", creds.ServerTLS(revoked))
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
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte("ok"))
				}
			}()
		}
	}()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	dial := func(kp *pki.KeyPair) error {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "node-a", NextProtos: []string{"h2"},
			Certificates: []tls.Certificate{kp.TLSCertificate()}})
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 2)
		_, err = c.Read(buf) // TLS 1.3 reports the server's refusal on the first read
		return err
	}
	operator, err := pki.IssueOperator(ca, "alice")
	if err != nil {
		t.Fatal(err)
	}
	server, err := pki.IssueServer(ca, []string{"gpuboot.example", "192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.IssueAgent(ca, "node-b", []net.IP{net.ParseIP("192.0.2.1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(operator); err != nil {
		t.Errorf("an operator certificate was refused: %v", err)
	}
	if err := dial(server); err == nil {
		t.Error("gpuboot's serving certificate was admitted as a client")
	}
	if err := dial(other); err == nil {
		t.Error("another node's agent certificate was admitted to the agent's API")
	}
	if err := pki.PeerHasRole(tls.ConnectionState{PeerCertificates: []*x509.Certificate{other.Cert}}, pki.RoleOperators); err == nil || !strings.Contains(err.Error(), "gpurack:agents") {
		t.Errorf("refusal of an agent certificate = %v; want it to name the role", err)
	}
	// gpuboot revokes alice (its heartbeat answer brings the list): refused at once.
	if err := revoked.Replace([]string{operator.Cert.SerialNumber.Text(16)}); err != nil {
		t.Fatal(err)
	}
	if err := dial(operator); err == nil {
		t.Error("a revoked operator certificate was admitted to the agent's API")
	}
}

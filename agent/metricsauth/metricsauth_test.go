package metricsauth

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// certs is a cluster CA with client certificates: the metrics server's, one with
// another CN, one from another CA, and a serving-only one.
type certs struct {
	ca                                     *pki.CA
	monitoring, wrongCN, otherCA, noClient *pki.KeyPair
}

func newCerts(t *testing.T) certs {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test cluster CA"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA, cn string, u pki.Usage) *pki.KeyPair {
		req := pki.CertRequest{CommonName: cn, Usages: []pki.Usage{u}}
		if u == pki.ServerAuth {
			req.DNSNames = []string{"x"}
		}
		kp, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	return certs{ca: ca, monitoring: issue(ca, MonitoringCN, pki.ClientAuth), wrongCN: issue(ca, "system:node:gpu-1", pki.ClientAuth),
		otherCA: issue(other, MonitoringCN, pki.ClientAuth), noClient: issue(ca, MonitoringCN, pki.ServerAuth)}
}

// serve runs an HTTPS server with g's TLS on loopback and returns its address.
func serve(t *testing.T, g *Gate) string {
	t.Helper()
	kp, err := ServingCert("gpu-1", []string{"gpu-1"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "gpurack_up 1\n") })}
	go srv.Serve(tls.NewListener(l, g.ServerTLS(kp.TLSCertificate())))
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// scrape GETs /metrics at addr with client (nil: no client certificate), as
// Prometheus does with insecure_skip_verify.
func scrape(addr string, client *pki.KeyPair) (string, error) {
	cfg := &tls.Config{InsecureSkipVerify: true}
	if client != nil {
		cfg.Certificates = []tls.Certificate{client.TLSCertificate()}
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestGateOverTLS(t *testing.T) {
	c := newCerts(t)
	g := &Gate{}
	addr := serve(t, g)

	// Before the CA: every scrape is refused, the metrics server's too.
	if _, err := scrape(addr, c.monitoring); err == nil {
		t.Fatal("scrape answered before the gate had a CA")
	}
	if err := g.Verify([][]byte{c.monitoring.Cert.Raw}); !errors.Is(err, ErrNoCA) {
		t.Fatalf("Verify before SetCA: %v, want ErrNoCA", err)
	}
	if err := g.SetCA(pki.EncodeCertPEM(c.ca.Cert)); err != nil {
		t.Fatal(err)
	}
	body, err := scrape(addr, c.monitoring)
	if err != nil || !strings.Contains(body, "gpurack_up 1") {
		t.Fatalf("the monitoring certificate's scrape: %q, %v", body, err)
	}
	for name, kp := range map[string]*pki.KeyPair{"no certificate": nil, "another CN": c.wrongCN, "another CA": c.otherCA, "a serving-only certificate": c.noClient} {
		if body, err := scrape(addr, kp); err == nil {
			t.Errorf("%s: scrape answered %q, want the handshake refused", name, body)
		}
	}
}

func TestGateVerifyReasons(t *testing.T) {
	c := newCerts(t)
	g := &Gate{}
	if err := g.SetCA(pki.EncodeCertPEM(c.ca.Cert)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		raw  [][]byte
		want string // "" passes
	}{
		{"monitoring", [][]byte{c.monitoring.Cert.Raw}, ""},
		{"another CN", [][]byte{c.wrongCN.Cert.Raw}, `CN "system:node:gpu-1" may not scrape`},
		{"another CA", [][]byte{c.otherCA.Cert.Raw}, "not signed by the cluster CA"},
		{"serving only", [][]byte{c.noClient.Cert.Raw}, "not signed by the cluster CA"},
		{"none", nil, "sent no certificate"},
		{"garbage", [][]byte{[]byte("not DER")}, "client certificate:"},
	} {
		err := g.Verify(tc.raw)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// Other CNs named: the monitoring certificate is then refused, the named one passes.
	g.CNs = []string{"system:node:gpu-1"}
	if err := g.Verify([][]byte{c.wrongCN.Cert.Raw}); err != nil {
		t.Errorf("named CN refused: %v", err)
	}
	if err := g.Verify([][]byte{c.monitoring.Cert.Raw}); err == nil {
		t.Error("a CN no longer named was let through")
	}
}

func TestSetCARefuses(t *testing.T) {
	c := newCerts(t)
	g := &Gate{}
	for name, pem := range map[string][]byte{"empty": nil, "not PEM": []byte("x"), "a leaf": pki.EncodeCertPEM(c.monitoring.Cert)} {
		if err := g.SetCA(pem); err == nil {
			t.Errorf("%s: accepted as the CA", name)
		}
	}
	if g.Armed() {
		t.Error("gate armed by refused CAs")
	}
}

func TestParseCNs(t *testing.T) {
	got := ParseCNs(" gpurack:monitoring, ,other ")
	if strings.Join(got, "|") != "gpurack:monitoring|other" {
		t.Errorf("ParseCNs: %q", got)
	}
	if ParseCNs(" , ") != nil {
		t.Error("ParseCNs of nothing is not empty")
	}
}

// FuzzVerify feeds arbitrary bytes as the client's certificates: Verify parses what a
// TLS client sends, before anything authenticates it.
func FuzzVerify(f *testing.F) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "fuzz CA"})
	if err != nil {
		f.Fatal(err)
	}
	kp, err := ca.Issue(pki.CertRequest{CommonName: MonitoringCN, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		f.Fatal(err)
	}
	g := &Gate{}
	if err := g.SetCA(pki.EncodeCertPEM(ca.Cert)); err != nil {
		f.Fatal(err)
	}
	f.Add(kp.Cert.Raw, ca.Cert.Raw)
	f.Add([]byte{0x30, 0x03, 0x02, 0x01, 0x00}, []byte{})
	f.Add(kp.Cert.Raw[:len(kp.Cert.Raw)/2], kp.Cert.Raw)
	f.Fuzz(func(t *testing.T, leaf, second []byte) {
		raw := [][]byte{leaf}
		if len(second) > 0 {
			raw = append(raw, second)
		}
		if err := g.Verify(raw); err == nil && string(leaf) != string(kp.Cert.Raw) {
			t.Fatalf("a certificate other than the issued one passed")
		}
	})
}

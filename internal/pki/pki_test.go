package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

func newTestCA(t *testing.T, cn string) *CA {
	t.Helper()
	ca, err := NewCA(CARequest{CommonName: cn, Organizations: []string{"gpurack"}})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T) func(*KeyPair, error) *KeyPair {
	return func(kp *KeyPair, err error) *KeyPair {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
}

func TestNewCA(t *testing.T) {
	before := time.Now()
	ca := newTestCA(t, "gpurack CA")
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("CA basic constraints: IsCA=%v valid=%v maxPathLen=%d zero=%v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA lacks certSign key usage")
	}
	if _, ok := ca.Key.(*ecdsa.PrivateKey); !ok {
		t.Errorf("CA key is %T, want ECDSA", ca.Key)
	}
	if c.Subject.CommonName != "gpurack CA" || !slices.Equal(c.Subject.Organization, []string{"gpurack"}) {
		t.Errorf("subject = %v", c.Subject)
	}
	if c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %v is not a positive 128-bit number", c.SerialNumber)
	}
	if c.NotBefore.After(before) {
		t.Errorf("NotBefore %v is after creation time %v: it must be backdated", c.NotBefore, before)
	}
	if got := c.NotAfter.Sub(before); got < DefaultCAValidity-time.Minute || got > DefaultCAValidity+time.Minute {
		t.Errorf("validity from now = %v, want about %v", got, DefaultCAValidity)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("CA is not self-signed: %v", err)
	}
	other := newTestCA(t, "gpurack CA")
	if other.Cert.SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Errorf("two CAs got the same serial")
	}
	if _, err := NewCA(CARequest{}); err == nil {
		t.Errorf("NewCA without CommonName succeeded")
	}
}

// TestChainUsages checks each role's certificate with x509.Verify against
// the CA for the usage it is for (must pass) and the one it is not (must
// fail), and against a different CA (must fail).
func TestChainUsages(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	otherCA := newTestCA(t, "other CA")
	must := mustIssue(t)
	server := must(IssueServer(ca, []string{"gpuboot.rack1.example", "10.0.0.1"}))
	agent := must(IssueAgent(ca, "gpu-node-01", []net.IP{net.ParseIP("10.0.0.21")}))
	operator := must(IssueOperator(ca, "alice"))

	tests := []struct {
		name  string
		cert  *x509.Certificate
		usage x509.ExtKeyUsage
		ok    bool
	}{
		{"server/serverAuth", server.Cert, x509.ExtKeyUsageServerAuth, true},
		{"server/clientAuth", server.Cert, x509.ExtKeyUsageClientAuth, false},
		{"agent/serverAuth", agent.Cert, x509.ExtKeyUsageServerAuth, true},
		{"agent/clientAuth", agent.Cert, x509.ExtKeyUsageClientAuth, true},
		{"operator/clientAuth", operator.Cert, x509.ExtKeyUsageClientAuth, true},
		{"operator/serverAuth", operator.Cert, x509.ExtKeyUsageServerAuth, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.cert.Verify(x509.VerifyOptions{Roots: ca.CertPool(), KeyUsages: []x509.ExtKeyUsage{tt.usage}})
			if (err == nil) != tt.ok {
				t.Errorf("Verify = %v, want ok=%v", err, tt.ok)
			}
			_, err = tt.cert.Verify(x509.VerifyOptions{Roots: otherCA.CertPool(), KeyUsages: []x509.ExtKeyUsage{tt.usage}})
			if err == nil {
				t.Errorf("verifies against an unrelated CA")
			}
		})
	}
	if _, err := server.Cert.Verify(x509.VerifyOptions{Roots: ca.CertPool(), DNSName: "gpuboot.rack1.example"}); err != nil {
		t.Errorf("server cert for its DNS SAN: %v", err)
	}
	if _, err := server.Cert.Verify(x509.VerifyOptions{Roots: ca.CertPool(), DNSName: "10.0.0.1"}); err != nil {
		t.Errorf("server cert for its IP SAN: %v", err)
	}
	if _, err := server.Cert.Verify(x509.VerifyOptions{Roots: ca.CertPool(), DNSName: "evil.example"}); err == nil {
		t.Errorf("server cert verified for a host it does not name")
	}
	if server.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf outlives its CA")
	}
}

func TestIssueCaps(t *testing.T) {
	// A leaf never outlives its CA.
	ca, err := NewCA(CARequest{CommonName: "short CA", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(CertRequest{CommonName: "x", Usages: []Usage{ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	if !kp.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %v, want capped at CA's %v", kp.Cert.NotAfter, ca.Cert.NotAfter)
	}
	// An expired CA issues nothing.
	old, err := NewCA(CARequest{CommonName: "old CA", Validity: time.Hour, NotBefore: time.Now().Add(-48 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Issue(CertRequest{CommonName: "x", Usages: []Usage{ClientAuth}}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("issue from expired CA: err = %v, want one saying it expired", err)
	}
	bad := []CertRequest{
		{Usages: []Usage{ClientAuth}},
		{CommonName: "x"},
		{CommonName: "x", Usages: []Usage{Usage(7)}},
		{CommonName: "x", Usages: []Usage{ServerAuth}}, // server without SANs
		{CommonName: "x", Usages: []Usage{ClientAuth}, Validity: -time.Hour},
	}
	for i, req := range bad {
		if _, err := ca.Issue(req); err == nil {
			t.Errorf("bad request %d (%+v) issued", i, req)
		}
	}
	// A CA whose key does not match its certificate refuses to issue.
	other := newTestCA(t, "other")
	mixed := &CA{Cert: ca.Cert, Key: other.Key}
	if _, err := mixed.Issue(CertRequest{CommonName: "x", Usages: []Usage{ClientAuth}}); err == nil {
		t.Errorf("CA with mismatched key issued a certificate")
	}
}

func TestIssueServerHosts(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	kp, err := IssueServer(ca, []string{"gpuboot.rack1.example", " 10.0.0.1", "fd00::1", "10.0.0.1", "", "GPUBOOT", "gpuboot", "fd00:0::1"})
	if err != nil {
		t.Fatal(err)
	}
	c := kp.Cert
	if !slices.Equal(c.DNSNames, []string{"gpuboot.rack1.example", "gpuboot"}) {
		t.Errorf("DNS SANs = %v", c.DNSNames)
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"10.0.0.1", "fd00::1"}) {
		t.Errorf("IP SANs = %v", ips)
	}
	if RoleOf(c) != RoleServers || c.Subject.CommonName != ServerCommonName {
		t.Errorf("role %q CN %q", RoleOf(c), c.Subject.CommonName)
	}
	for _, hosts := range [][]string{nil, {""}, {"gpuboot:8443"}, {"https://gpuboot"}, {"bad_name"}, {"a..b"}} {
		if _, err := IssueServer(ca, hosts); err == nil {
			t.Errorf("IssueServer(%q) succeeded", hosts)
		}
	}
}

func TestIssueAgent(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	kp, err := IssueAgent(ca, "gpu-node-01.rack1", []net.IP{net.ParseIP("10.0.0.21"), net.ParseIP("fd00::21"), net.ParseIP("10.0.0.21"), nil})
	if err != nil {
		t.Fatal(err)
	}
	c := kp.Cert
	if c.Subject.CommonName != "gpu-node-01.rack1" || !slices.Equal(c.DNSNames, []string{"gpu-node-01.rack1"}) || len(c.IPAddresses) != 2 {
		t.Errorf("CN %q DNS %v IPs %v", c.Subject.CommonName, c.DNSNames, c.IPAddresses)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}) {
		t.Errorf("ExtKeyUsage = %v", c.ExtKeyUsage)
	}
	for _, name := range []string{"", "Node1", "-node", "node-", "node_1", "a..b", strings.Repeat("a", 64), "node 1"} {
		if _, err := IssueAgent(ca, name, nil); err == nil {
			t.Errorf("IssueAgent(%q) succeeded", name)
		}
	}
	for _, name := range []string{"n", "node-1", "gpu-01.rack-2.dc"} {
		if _, err := IssueAgent(ca, name, nil); err != nil {
			t.Errorf("IssueAgent(%q): %v", name, err)
		}
	}
}

func TestRoleOf(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	must := mustIssue(t)
	issue := func(orgs ...string) *x509.Certificate {
		return must(ca.Issue(CertRequest{CommonName: "x", Organizations: orgs, Usages: []Usage{ClientAuth}})).Cert
	}
	tests := []struct {
		name string
		cert *x509.Certificate
		want Role
	}{
		{"server", must(IssueServer(ca, []string{"gpuboot"})).Cert, RoleServers},
		{"agent", must(IssueAgent(ca, "node-1", nil)).Cert, RoleAgents},
		{"operator", must(IssueOperator(ca, "alice")).Cert, RoleOperators},
		{"no O", issue(), ""},
		{"unrelated O", issue("system:nodes"), ""},
		{"role among others", issue("acme", "gpurack:operators"), RoleOperators},
		{"same role twice", issue("gpurack:agents", "gpurack:agents"), RoleAgents},
		{"two roles", issue("gpurack:agents", "gpurack:operators"), ""},
		{"case differs", issue("GPURACK:operators"), ""},
		{"CA", ca.Cert, ""},
		{"nil", nil, ""},
	}
	for _, tt := range tests {
		if got := RoleOf(tt.cert); got != tt.want {
			t.Errorf("%s: RoleOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestSPKIPinIndependent computes the pin from the public key itself rather
// than from the certificate's stored SPKI bytes, and with openssl.
func TestSPKIPinIndependent(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	der, err := x509.MarshalPKIXPublicKey(ca.Key.Public())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	want := "sha256:" + hex.EncodeToString(sum[:])
	if got := SPKIPin(ca.Cert); got != want {
		t.Errorf("SPKIPin = %s, want %s", got, want)
	}
	if ca.Pin() != want {
		t.Errorf("CA.Pin = %s, want %s", ca.Pin(), want)
	}

	t.Run("openssl", func(t *testing.T) { opensslAgreesOnPin(t, ca) })
}

// opensslAgreesOnPin computes the pin of ca's certificate with openssl and compares it
// with SPKIPin.
func opensslAgreesOnPin(t *testing.T, ca *CA) {
	testreq.Tool(t, "openssl", "apt-get install openssl (hack/deps.sh lists it); it cross-checks the pin")
	dir := t.TempDir()
	certPath := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(certPath, EncodeCertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	pubPEM, err := exec.Command("openssl", "x509", "-in", certPath, "-pubkey", "-noout").Output()
	if err != nil {
		t.Fatalf("openssl x509 -pubkey: %v", err)
	}
	cmd := exec.Command("openssl", "pkey", "-pubin", "-outform", "der")
	cmd.Stdin = bytes.NewReader(pubPEM)
	pubDER, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl pkey: %v", err)
	}
	osum := sha256.Sum256(pubDER)
	if got, want := SPKIPin(ca.Cert), "sha256:"+hex.EncodeToString(osum[:]); got != want {
		t.Errorf("SPKIPin = %s, openssl gives %s", got, want)
	}
}

func TestVerifyPin(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	other := newTestCA(t, "other CA")
	pin := ca.Pin()
	if err := VerifyPin(ca.Cert, pin); err != nil {
		t.Errorf("own pin: %v", err)
	}
	if err := VerifyPin(ca.Cert, "sha256:"+strings.ToUpper(strings.TrimPrefix(pin, "sha256:"))); err != nil {
		t.Errorf("upper-case pin: %v", err)
	}
	if err := VerifyPin(other.Cert, pin); err == nil {
		t.Errorf("another CA matched the pin")
	}
	for _, bad := range []string{"", strings.TrimPrefix(pin, "sha256:"), "sha1:" + strings.TrimPrefix(pin, "sha256:"), pin[:len(pin)-2], pin + "00", pin[:len(pin)-1] + "g", "sha256:"} {
		if err := VerifyPin(ca.Cert, bad); err == nil {
			t.Errorf("VerifyPin(%q) succeeded", bad)
		}
		if err := ValidatePin(bad); err == nil {
			t.Errorf("ValidatePin(%q) succeeded", bad)
		}
	}
}

func TestVerifyLeafAgainstPin(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	evil := newTestCA(t, "gpurack CA") // same name, different key
	must := mustIssue(t)
	server := must(IssueServer(ca, []string{"gpuboot.test", "10.0.0.1"}))
	evilServer := must(IssueServer(evil, []string{"gpuboot.test"}))
	agent := must(IssueAgent(ca, "node-1", nil))
	pin := ca.Pin()
	srv := PinnedVerifyOptions{Usage: ServerAuth, Role: RoleServers}

	tests := []struct {
		name  string
		chain []*x509.Certificate
		pin   string
		opts  PinnedVerifyOptions
		err   string // substring; "" means success
	}{
		{"good", []*x509.Certificate{server.Cert, ca.Cert}, pin, srv, ""},
		{"good with host", []*x509.Certificate{server.Cert, ca.Cert}, pin, PinnedVerifyOptions{Usage: ServerAuth, DNSName: "gpuboot.test"}, ""},
		{"wrong host", []*x509.Certificate{server.Cert, ca.Cert}, pin, PinnedVerifyOptions{Usage: ServerAuth, DNSName: "other.test"}, "does not verify"},
		{"no CA in chain", []*x509.Certificate{server.Cert}, pin, srv, "none of the 1 certificates"},
		{"wrong pin", []*x509.Certificate{server.Cert, ca.Cert}, evil.Pin(), srv, "has the pinned key"},
		{"foreign leaf next to pinned CA", []*x509.Certificate{evilServer.Cert, ca.Cert}, pin, srv, "does not verify"},
		{"foreign leaf with both CAs", []*x509.Certificate{evilServer.Cert, evil.Cert, ca.Cert}, pin, srv, "does not verify"},
		{"agent posing as server", []*x509.Certificate{agent.Cert, ca.Cert}, pin, srv, "role"},
		{"wrong usage", []*x509.Certificate{server.Cert, ca.Cert}, pin, PinnedVerifyOptions{Usage: ClientAuth}, "does not verify"},
		{"no usage", []*x509.Certificate{server.Cert, ca.Cert}, pin, PinnedVerifyOptions{}, "Usage"},
		{"expired", []*x509.Certificate{server.Cert, ca.Cert}, pin, PinnedVerifyOptions{Usage: ServerAuth, CurrentTime: time.Now().Add(2 * DefaultLeafValidity)}, "does not verify"},
		{"empty chain", nil, pin, srv, "no certificate"},
		{"malformed pin", []*x509.Certificate{server.Cert, ca.Cert}, "abc", srv, "must start with"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf, err := VerifyLeafAgainstPin(tt.chain, tt.pin, tt.opts)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if leaf != tt.chain[0] {
					t.Errorf("returned leaf is not chain[0]")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("err = %v, want one containing %q", err, tt.err)
			}
		})
	}
}

func TestPEMRoundTrip(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	kp := mustIssue(t)(IssueOperator(ca, "alice"))
	c, err := DecodeCertPEM(EncodeCertPEM(kp.Cert))
	if err != nil || !c.Equal(kp.Cert) {
		t.Fatalf("cert round trip: %v", err)
	}
	keyPEM, err := EncodeKeyPEM(kp.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(keyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Errorf("key PEM is not PKCS#8: %s", keyPEM[:30])
	}
	key, err := DecodeKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := keyMatchesCert(key, kp.Cert); err != nil {
		t.Error(err)
	}
	chain, err := DecodeCertsPEM(append(EncodeCertPEM(kp.Cert), EncodeCertPEM(ca.Cert)...))
	if err != nil || len(chain) != 2 || !chain[1].Equal(ca.Cert) {
		t.Errorf("chain decode: %v, %d certs", err, len(chain))
	}
	if _, err := DecodeCertPEM(append(EncodeCertPEM(kp.Cert), EncodeCertPEM(ca.Cert)...)); err == nil {
		t.Errorf("DecodeCertPEM accepted two certificates")
	}
	if _, err := DecodeCertPEM(keyPEM); err == nil {
		t.Errorf("DecodeCertPEM accepted a key")
	}
	if _, err := DecodeCertPEM([]byte("garbage")); err == nil {
		t.Errorf("DecodeCertPEM accepted garbage")
	}
	ecDER, err := x509.MarshalECPrivateKey(kp.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	_, err = DecodeKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER}))
	if err == nil || !strings.Contains(err.Error(), "openssl pkcs8") {
		t.Errorf("SEC1 key: err = %v, want a hint to convert with openssl pkcs8", err)
	}
	if _, err := DecodeKeyPEM(EncodeCertPEM(kp.Cert)); err == nil {
		t.Errorf("DecodeKeyPEM accepted a certificate")
	}
}

func TestSaveLoadCA(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	dir := filepath.Join(t.TempDir(), "pki")
	if err := SaveCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("CA directory mode: %v %v, want 0700", fi.Mode().Perm(), err)
	}
	assertOnlyFiles(t, dir, CACertFile, CAKeyFile)

	got, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) || got.Pin() != ca.Pin() {
		t.Errorf("loaded CA differs")
	}
	if err := keyMatchesCert(got.Key, ca.Cert); err != nil {
		t.Error(err)
	}
	// The loaded CA can issue, and what it issues chains to the original.
	kp := mustIssue(t)(IssueOperator(got, "bob"))
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: ca.CertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Error(err)
	}

	// Never replaced.
	other := newTestCA(t, "other")
	err = SaveCA(dir, other)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("SaveCA over an existing CA: err = %v", err)
	}
	if again, _ := LoadCA(dir); again == nil || !again.Cert.Equal(ca.Cert) {
		t.Errorf("existing CA was changed")
	}
	assertOnlyFiles(t, dir, CACertFile, CAKeyFile)

	// Missing directory: the error names the file and says what to do.
	_, err = LoadCA(filepath.Join(t.TempDir(), "nope"))
	if err == nil || !strings.Contains(err.Error(), CACertFile) || !strings.Contains(err.Error(), "create the CA first") {
		t.Errorf("LoadCA(missing) err = %v", err)
	}

	// Key from another CA: the error names both files.
	mixed := filepath.Join(t.TempDir(), "mixed")
	if err := SaveCA(mixed, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, CACertFile), filepath.Join(mixed, CACertFile)); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCA(mixed)
	if err == nil || !strings.Contains(err.Error(), "do not match") || !strings.Contains(err.Error(), filepath.Join(mixed, CAKeyFile)) {
		t.Errorf("LoadCA(mismatched) err = %v", err)
	}

	// A corrupt key file is named.
	corrupt := filepath.Join(t.TempDir(), "corrupt")
	if err := SaveCA(corrupt, other); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, CAKeyFile), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCA(corrupt)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(corrupt, CAKeyFile)) {
		t.Errorf("LoadCA(corrupt key) err = %v", err)
	}
}

func TestSaveLoadKeyPair(t *testing.T) {
	ca := newTestCA(t, "gpurack CA")
	must := mustIssue(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "agent.crt"), filepath.Join(dir, "agent.key")
	first := must(IssueAgent(ca, "node-1", nil))
	if err := SaveKeyPair(certPath, keyPath, first); err != nil {
		t.Fatal(err)
	}
	// Renewal replaces the pair in place.
	second := must(IssueAgent(ca, "node-1", nil))
	if err := SaveKeyPair(certPath, keyPath, second); err != nil {
		t.Fatal(err)
	}
	got, err := LoadKeyPair(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(second.Cert) {
		t.Errorf("loaded the old certificate")
	}
	if fi, _ := os.Stat(keyPath); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", fi.Mode().Perm())
	}
	assertOnlyFiles(t, dir, "agent.crt", "agent.key")
	// A leaf is not a CA.
	if err := os.Rename(certPath, filepath.Join(dir, CACertFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(keyPath, filepath.Join(dir, CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("LoadCA(leaf) err = %v", err)
	}
}

// assertOnlyFiles fails if dir holds anything but names (no temporary files
// left behind).
func assertOnlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

func TestOperatorLevels(t *testing.T) {
	ca, err := NewCA(CARequest{CommonName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ous ...string) *x509.Certificate {
		kp, err := ca.Issue(CertRequest{CommonName: "x", Organizations: []string{string(RoleOperators)}, OrganizationalUnits: ous, Usages: []Usage{ClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		return kp.Cert
	}
	viewer := mustIssue(t)(IssueOperatorLevel(ca, "v", LevelViewer)).Cert
	agent := mustIssue(t)(IssueAgent(ca, "node-1", nil)).Cert
	for _, tt := range []struct {
		name string
		cert *x509.Certificate
		want OperatorLevel
	}{
		{"viewer", viewer, LevelViewer},
		{"admin by IssueOperator", mustIssue(t)(IssueOperator(ca, "a")).Cert, LevelAdmin},
		{"no level: issued before levels, an admin", issue(), LevelAdmin},
		{"two levels: none", issue(string(LevelViewer), string(LevelAdmin)), ""},
		{"unknown OU ignored", issue("team-a", string(LevelOperator)), LevelOperator},
		{"agent: no level", agent, ""},
	} {
		if got := OperatorLevelOf(tt.cert); got != tt.want {
			t.Errorf("%s: OperatorLevelOf = %q, want %q", tt.name, got, tt.want)
		}
	}
	if LevelViewer.Allows(LevelOperator) || !LevelAdmin.Allows(LevelViewer) || !LevelOperator.Allows(LevelOperator) || OperatorLevel("").Allows(LevelViewer) || LevelAdmin.Allows("") {
		t.Error("Allows does not nest viewer < operator < admin, or lets an empty level through")
	}
	if _, err := IssueOperatorLevel(ca, "x", "root"); err == nil {
		t.Error("IssueOperatorLevel took an unknown level")
	}
	if l, err := ParseOperatorLevel("operator"); err != nil || l != LevelOperator {
		t.Errorf("ParseOperatorLevel(operator) = %q, %v", l, err)
	}
	if _, err := ParseOperatorLevel("root"); err == nil || !strings.Contains(err.Error(), "viewer, operator, admin, alert-sender or metrics-reader") {
		t.Errorf("ParseOperatorLevel(root) = %v", err)
	}
}

// TestAlertSenderLevel: the alert-sender level is issued, parsed and read back like the
// others, but stands outside their order: it allows only what needs exactly it, and no
// viewer, operator or admin allows that.
func TestAlertSenderLevel(t *testing.T) {
	ca, err := NewCA(CARequest{CommonName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := ParseOperatorLevel("alert-sender"); err != nil || l != LevelAlertSender {
		t.Fatalf("ParseOperatorLevel(alert-sender) = %q, %v", l, err)
	}
	kp, err := IssueOperatorLevel(ca, "alertmanager", LevelAlertSender)
	if err != nil {
		t.Fatal(err)
	}
	if got := OperatorLevelOf(kp.Cert); got != LevelAlertSender {
		t.Errorf("OperatorLevelOf(alert-sender certificate) = %q", got)
	}
	if !LevelAlertSender.Allows(LevelAlertSender) {
		t.Error("alert-sender does not allow what needs alert-sender")
	}
	for _, l := range Levels {
		if LevelAlertSender.Allows(l) {
			t.Errorf("alert-sender allows what needs %s", l.Name())
		}
		if l.Allows(LevelAlertSender) {
			t.Errorf("%s allows what needs alert-sender", l.Name())
		}
	}
	if OperatorLevel("").Allows(LevelAlertSender) {
		t.Error("no level allows what needs alert-sender")
	}
}

package server_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/server"
)

// served is the certificate gpuboot presents to a client that pins the CA, as agents
// and operators do, over a fresh TLS connection.
func (in *instance) served() *x509.Certificate {
	in.t.Helper()
	conn, err := tls.Dial("tcp", in.tlsAddr, pki.ClientConfigPinned(in.pin))
	if err != nil {
		in.t.Fatalf("TLS to gpuboot pinned to the CA: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// certMetric reads gpurack_certificate_expiry_timestamp_seconds{component="gpuboot",
// name=name} from gpuboot's /metrics; the zero time when there is none.
func (in *instance) certMetric(name string) time.Time {
	in.t.Helper()
	body := []byte(in.scrapeMetrics())
	re := regexp.MustCompile(`(?m)^gpurack_certificate_expiry_timestamp_seconds\{component="gpuboot",name="` + regexp.QuoteMeta(name) + `"\} (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return time.Time{}
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		in.t.Fatal(err)
	}
	return time.Unix(int64(v), 0)
}

// TestCertsServerAndOperatorRenewal: against a running gpuboot, `gpuboot certs server`
// reissues the serving certificate with new names and gpuboot presents it to new
// connections without a restart (a client pinned to the CA sees the new serial, names
// and NotAfter, and /metrics the new expiry); `gpuboot certs renew operator` gives an
// operator a new certificate at its level, which works at once while the old one still
// does; `gpuboot certs revoke operator` is `gpuboot operators revoke`; `gpuboot certs
// check-expiration` lists all of it; /metrics has each operator's latest certificate
// that is not revoked.
func TestCertsServerAndOperatorRenewal(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	state := filepath.Join(in.dir, "state")
	before := in.served()
	if !slices.Contains(before.DNSNames, "localhost") || !in.certMetric("server").Equal(before.NotAfter) {
		t.Fatalf("before: names %v, metric %s, NotAfter %s", before.DNSNames, in.certMetric("server"), before.NotAfter)
	}
	caPEM, _ := os.ReadFile(filepath.Join(state, "pki", "ca.crt"))
	ca, _ := pki.DecodeCertPEM(caPEM)
	if !in.certMetric("ca").Equal(ca.NotAfter) {
		t.Errorf("CA expiry on /metrics %s, want %s", in.certMetric("ca"), ca.NotAfter)
	}

	time.Sleep(1100 * time.Millisecond) // a NotAfter one second later, to tell them apart
	out := in.run("certs", "server", "--state-dir", state, "--advertise", "gpuboot-b.example.test,192.0.2.7")
	if !strings.Contains(out, "gpuboot-b.example.test") || !strings.Contains(out, "192.0.2.7") {
		t.Errorf("certs server printed %q", out)
	}
	var after *x509.Certificate
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if after = in.served(); after.SerialNumber.Cmp(before.SerialNumber) != 0 || time.Now().After(deadline) {
			break
		}
	}
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 {
		t.Fatalf("gpuboot still serves serial %s 10 s after certs server\n%s", before.SerialNumber.Text(16), in.log)
	}
	wantIPs := []string{"192.0.2.7", "127.0.0.1"}
	var gotIPs []string
	for _, ip := range after.IPAddresses {
		gotIPs = append(gotIPs, ip.String())
	}
	if !slices.Equal(after.DNSNames, []string{"gpuboot-b.example.test", "localhost"}) || !slices.Equal(gotIPs, wantIPs) || !after.NotAfter.After(before.NotAfter) {
		t.Errorf("served after reissue: DNS %v IPs %v NotAfter %s; want [gpuboot-b.example.test localhost] %v, after %s", after.DNSNames, gotIPs, after.NotAfter, wantIPs, before.NotAfter)
	}
	if got := in.certMetric("server"); !got.Equal(after.NotAfter) {
		t.Errorf("server expiry on /metrics %s, want the new %s", got, after.NotAfter)
	}
	in.cli("machines", "list") // the operator CLI on gpuboot's host still reaches it

	in.run("certs", "operator", "carol", "--state-dir", state, "--level", "operator")
	carol := filepath.Join(state, "operators", "carol")
	oldCarol := readCert(t, filepath.Join(carol, "operator.crt"))
	saved := t.TempDir() // the old credentials, to show they still work
	for _, f := range []string{"ca.crt", "operator.crt", "operator.key"} {
		b, _ := os.ReadFile(filepath.Join(carol, f))
		os.WriteFile(filepath.Join(saved, f), b, 0o600)
	}
	out = in.run("certs", "renew", "operator", "carol", "--state-dir", state)
	newCarol := readCert(t, filepath.Join(carol, "operator.crt"))
	if newCarol.SerialNumber.Cmp(oldCarol.SerialNumber) == 0 || pki.OperatorLevelOf(newCarol) != pki.LevelOperator || newCarol.Subject.CommonName != "carol" {
		t.Fatalf("renewed carol: serial %s (old %s), level %q, CN %q\n%s", newCarol.SerialNumber.Text(16), oldCarol.SerialNumber.Text(16), pki.OperatorLevelOf(newCarol), newCarol.Subject.CommonName, out)
	}
	for _, creds := range []string{carol, saved} {
		in.run("machines", "list", "--server", in.tlsAddr, "--credentials", creds)
	}
	if got := in.certMetric("operator/carol"); !got.Equal(newCarol.NotAfter) {
		t.Errorf("carol's expiry on /metrics %s, want the renewed certificate's %s", got, newCarol.NotAfter)
	}

	out = in.cli("certs", "revoke", "operator", "carol", "--reason", "left the team")
	if !strings.Contains(out, "2 certificate(s) revoked") {
		t.Errorf("certs revoke operator carol: %q; want both recorded certificates revoked", out)
	}
	if b, err := exec.Command(in.bin, "machines", "list", "--server", in.tlsAddr, "--credentials", carol).CombinedOutput(); err == nil {
		t.Errorf("carol's renewed certificate still works after the revocation:\n%s", b)
	}
	if got := in.certMetric("operator/carol"); !got.IsZero() {
		t.Errorf("a revoked operator's expiry is still on /metrics (%s)", got)
	}
	if got := in.certMetric("operator/admin"); got.IsZero() {
		t.Error("no expiry for operator/admin on /metrics")
	}

	var list []server.CertificateExpiry
	if err := json.Unmarshal([]byte(in.run("certs", "check-expiration", "--state-dir", state, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	byName := map[string]server.CertificateExpiry{}
	for _, e := range list {
		byName[e.Name] = e
	}
	if e := byName["server"]; e.Serial != after.SerialNumber.Text(16) || e.Residual < 364*24*3600 {
		t.Errorf("check-expiration server: %+v", e)
	}
	if e := byName["operator/carol"]; !e.Revoked || e.Level != "operator" {
		t.Errorf("check-expiration carol: %+v; want revoked, level operator", e)
	}
	if e := byName["operator/admin"]; e.Revoked || e.Level != "admin" || e.Residual <= 0 {
		t.Errorf("check-expiration admin: %+v", e)
	}
	if e := byName["ca"]; e.Residual < 9*365*24*3600 {
		t.Errorf("check-expiration ca: %+v", e)
	}
	table := in.run("certs", "check-expiration", "--state-dir", state)
	if !regexp.MustCompile(`(?m)^operator/carol\s.*revoked$`).MatchString(table) || !regexp.MustCompile(`(?m)^server\s+gpuboot\s.*\s36[45]d\s+ok$`).MatchString(table) {
		t.Errorf("check-expiration table:\n%s", table)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.DecodeCertPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCertsCommandsWithoutCAKey: with the CA key gone, `gpuboot certs server` and
// `gpuboot certs renew operator` fail naming the missing file and change no file;
// renewing an operator without a certificate names the file renew reads the level from;
// an unknown state directory is named by check-expiration.
func TestCertsCommandsWithoutCAKey(t *testing.T) {
	in := newInstance(t, "")
	state := filepath.Join(in.dir, "state")
	files := []string{"pki/server.crt", "pki/server.key", "operators/admin/operator.crt", "operators/admin/operator.key", "operators/admin/ca.crt", "operators/issued"}
	snapshot := func() map[string][]byte {
		m := map[string][]byte{}
		for _, f := range files {
			m[f], _ = os.ReadFile(filepath.Join(state, f))
		}
		return m
	}
	keyPath := filepath.Join(state, "pki", "ca.key")
	if err := os.Rename(keyPath, keyPath+".away"); err != nil {
		t.Fatal(err)
	}
	was := snapshot()
	fail := func(want string, args ...string) {
		t.Helper()
		out, err := exec.Command(in.bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("gpuboot %s: %v\n%s\nwant an error naming %s", strings.Join(args, " "), err, out, want)
		}
	}
	fail(keyPath, "certs", "server", "--state-dir", state, "--advertise", "gpuboot-b.example.test")
	fail(keyPath, "certs", "renew", "operator", "admin", "--state-dir", state)
	now := snapshot()
	for _, f := range files {
		if !bytes.Equal(was[f], now[f]) {
			t.Errorf("%s changed although the CA key is missing", f)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(state, "pki")); len(entries) != 5 { // ca.crt, ca.key.away, server.crt, server.key, revoked.json
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("pki/ holds %v; want no new (temporary) file", names)
	}
	os.Rename(keyPath+".away", keyPath)
	fail(filepath.Join(state, "operators", "nobody", "operator.crt"), "certs", "renew", "operator", "nobody", "--state-dir", state)
	fail("operator \"admin\"'s certificate", "certs", "renew", "operator", "bob", "--state-dir", state, "--out", filepath.Join(state, "operators", "admin"))
	fail(filepath.Join(in.dir, "nowhere", "pki", "ca.crt"), "certs", "check-expiration", "--state-dir", filepath.Join(in.dir, "nowhere"))
	fail(`"advertise" not set`, "certs", "server", "--state-dir", state)
}

package registryauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/internal/pki"
)

// issuerFixture is an issuer on loopback HTTPS with its stores in a directory.
type issuerFixture struct {
	url                   string
	client                *http.Client
	roots                 *x509.CertPool
	usersFile, robotsFile string
	mu                    sync.Mutex
	log                   strings.Builder
}

func (f *issuerFixture) logText() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.log.String()
}

func startIssuer(t *testing.T) *issuerFixture {
	t.Helper()
	minter, roots, dir := testMinter(t)
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test-ca"})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue(pki.CertRequest{CommonName: "gpurack-registry", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	f := &issuerFixture{roots: roots, usersFile: filepath.Join(dir, tenantusers.StoreFile), robotsFile: filepath.Join(dir, RobotsFile)}
	h := &Handler{Service: Service, UsersFile: f.usersFile, RobotsFile: f.robotsFile, Minter: minter,
		Logf: func(format string, args ...any) {
			f.mu.Lock()
			defer f.mu.Unlock()
			fmt.Fprintf(&f.log, format+"\n", args...)
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, serving.TLSCertificate(), h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.url = "https://" + ln.Addr().String() + "/token"
	f.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.CertPool()}}}
	return f
}

// get asks for a token with name and password (no Authorization header when name is
// empty) and returns the status, headers and body.
func (f *issuerFixture) get(t *testing.T, name, password string, query url.Values) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url+"?"+query.Encode(), nil)
	if name != "" {
		req.SetBasicAuth(name, password)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

func q(service string, scopes ...string) url.Values {
	v := url.Values{"service": {service}}
	if len(scopes) > 0 {
		v["scope"] = scopes
	}
	return v
}

// addUser records a credential of user with a fresh registry password and returns it.
func addUser(t *testing.T, s *tenantusers.Store, user, tenant, role string, notAfter time.Time) string {
	t.Helper()
	id := fmt.Sprintf("%08x", len(s.Credentials)+1)
	s.Credentials = append(s.Credentials, tenantusers.Credential{User: user, Tenant: tenant, Role: role, ID: id, NotAfter: notAfter})
	pw, err := IssueUserPassword(s, id)
	if err != nil {
		t.Fatal(err)
	}
	return pw
}

func TestIssuerOverHTTPS(t *testing.T) {
	f := startIssuer(t)
	now := time.Now()
	users := &tenantusers.Store{}
	alicePW := addUser(t, users, "alice", "team-a", tenantusers.RoleUser, now.Add(time.Hour))
	bobPW := addUser(t, users, "bob", "team-b", tenantusers.RoleUser, now.Add(time.Hour))
	davePW := addUser(t, users, "dave", "team-a", tenantusers.RoleUser, now.Add(-time.Second))
	if err := users.Save(f.usersFile); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(f.usersFile)
	for _, pw := range []string{alicePW, bobPW, davePW} {
		if strings.Contains(string(data), pw) {
			t.Fatal("a registry password is in the user store in plaintext")
		}
	}

	code, _, body := f.get(t, "alice", alicePW, q(Service, "repository:team-a/train:pull,push"))
	if code != http.StatusOK {
		t.Fatalf("alice's push token: %d %s", code, body)
	}
	var resp TokenResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	c, err := verifyToken(t, resp.Token, f.roots, time.Now())
	if err != nil || c.Subject != "alice" || len(c.Access) != 1 || c.Access[0].Name != "team-a/train" {
		t.Fatalf("alice's token: %+v %v", c, err)
	}
	if code, _, body := f.get(t, "alice", alicePW, q(Service)); code != http.StatusOK {
		t.Errorf("alice's login (no scope): %d %s", code, body)
	}

	code, _, body = f.get(t, "alice", alicePW, q(Service, "repository:team-b/train:pull,push"))
	var regErr registryError
	json.Unmarshal([]byte(body), &regErr)
	want := "user alice of tenant team-a may push and pull only under team-a/; team-b/train is outside it"
	if code != http.StatusForbidden || len(regErr.Errors) != 1 || regErr.Errors[0].Code != "DENIED" || regErr.Errors[0].Message != want {
		t.Errorf("alice asking for team-b: %d %s; want 403 DENIED %q", code, body, want)
	}
	if code, _, body := f.get(t, "bob", bobPW, q(Service, "registry:catalog:*")); code != http.StatusForbidden || !strings.Contains(body, "catalog") {
		t.Errorf("bob asking for the catalog: %d %s", code, body)
	}
	if code, _, body := f.get(t, "alice", alicePW, q("other-registry", "repository:team-a/x:pull")); code != http.StatusBadRequest || !strings.Contains(body, "service gpurack-registry only") {
		t.Errorf("another service: %d %s", code, body)
	}
	if code, _, _ := f.get(t, "alice", alicePW, url.Values{"scope": {"repository:team-a/x:pull"}}); code != http.StatusBadRequest {
		t.Errorf("no service: %d", code)
	}
	if code, _, body := f.get(t, "alice", alicePW, q(Service, "repository:team-a/x:pull:push")); code != http.StatusBadRequest || !strings.Contains(body, "TYPE:NAME:ACTIONS") {
		t.Errorf("a malformed scope: %d %s", code, body)
	}
	if code, _, _ := f.get(t, "alice", alicePW, url.Values{"service": {Service}, "account": {"bob"}}); code != http.StatusBadRequest {
		t.Errorf("account naming another user: %d", code)
	}

	// Every failed authentication looks the same to the client.
	var first string
	for i, cred := range [][2]string{{"", ""}, {"mallory", alicePW}, {"alice", bobPW}, {"alice", ""}, {"dave", davePW}, {RobotUser("team-a"), "x"}} {
		code, hdr, body := f.get(t, cred[0], cred[1], q(Service, "repository:team-a/x:pull"))
		if code != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != `Basic realm="gpurack-registry"` {
			t.Errorf("%q: %d %q", cred[0], code, hdr.Get("WWW-Authenticate"))
		}
		if i == 0 {
			first = body
		} else if body != first {
			t.Errorf("%q: the 401 body %q differs from %q: it tells which check failed", cred[0], body, first)
		}
	}
	logText := f.logText()
	for _, w := range []string{`refused "mallory"`, `unknown user`, `refused "alice"`, `wrong password`, `refused "dave"`, "is expired",
		`denied "alice" (tenant team-a, user)`, "team-b/train is outside it", `granted "alice"`} {
		if !strings.Contains(logText, w) {
			t.Errorf("the log lacks %q:\n%s", w, logText)
		}
	}

	// Revoking takes effect at the next request: the issuer reads the store each time.
	// (As tenantusers.Revoke marks it; that the CLI's revoke does so is
	// TestCLIRegistryCredentials's.)
	rev := time.Now().UTC()
	users.Credentials[0].RevokedAt = &rev
	if err := users.Save(f.usersFile); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := f.get(t, "alice", alicePW, q(Service, "repository:team-a/train:pull")); code != http.StatusUnauthorized {
		t.Errorf("alice after revocation: %d", code)
	}
	if !strings.Contains(f.logText(), "is revoked") {
		t.Errorf("the revocation refusal is not logged:\n%s", f.logText())
	}
}

package server_test

import (
	"crypto/tls"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRevokeOperator: `gpuboot operators revoke NAME` against a running gpuboot ends
// NAME's access at once, certificate and token both, while the revoking operator keeps
// its own; a token issued while gpuboot runs works without a restart; an operator
// cannot revoke itself.
func TestRevokeOperator(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	state := filepath.Join(in.dir, "state")
	// Issued while gpuboot runs: the token works without a restart.
	out := in.run("certs", "operator", "bob", "--state-dir", state, "--token", "--token-ttl", "1h")
	var token string
	for _, line := range strings.Split(out, "\n") {
		if _, tok, ok := strings.Cut(line, "picks it up within a second): "); ok {
			token = strings.TrimSpace(tok)
		}
	}
	if token == "" {
		t.Fatalf("no token printed:\n%s", out)
	}
	bobCreds := filepath.Join(state, "operators", "bob")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	rest := func() int {
		req, _ := http.NewRequest("GET", "https://"+in.tlsAddr+"/api/v1/machines", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	time.Sleep(1100 * time.Millisecond) // the token file is looked at once a second at most
	if code := rest(); code != http.StatusOK {
		t.Fatalf("bob's new token before revocation: HTTP %d", code)
	}
	bob := func(args ...string) (string, error) {
		b, err := exec.Command(in.bin, append(args, "--server", in.tlsAddr, "--credentials", bobCreds)...).CombinedOutput()
		return string(b), err
	}
	if out, err := bob("machines", "list"); err != nil {
		t.Fatalf("bob's certificate before revocation: %v\n%s", err, out)
	}
	if out, err := exec.Command(in.bin, "operators", "revoke", "admin", "--server", in.tlsAddr, "--credentials", in.creds).CombinedOutput(); err == nil || !strings.Contains(string(out), "cannot revoke itself") {
		t.Fatalf("admin revoking itself: %v\n%s", err, out)
	}
	out = in.cli("operators", "revoke", "bob", "--reason", "left the team")
	if !strings.Contains(out, "1 certificate(s) revoked") || !strings.Contains(out, "1 token(s) removed") {
		t.Fatalf("revoke output:\n%s", out)
	}
	if out, err := bob("machines", "list"); err == nil {
		t.Fatalf("bob's revoked certificate still works:\n%s", out)
	}
	time.Sleep(1100 * time.Millisecond)
	if code := rest(); code != http.StatusUnauthorized {
		t.Fatalf("bob's token after revocation: HTTP %d, want 401", code)
	}
	in.cli("machines", "list") // the revoking operator keeps its access
	if !strings.Contains(in.log.String(), "operator credentials revoked") {
		t.Errorf("gpuboot's log does not record the revocation:\n%s", in.log)
	}
	if out, err := exec.Command(in.bin, "operators", "revoke", "nobody", "--server", in.tlsAddr, "--credentials", in.creds).CombinedOutput(); err == nil || !strings.Contains(string(out), `no certificate or token recorded for operator "nobody"`) {
		t.Fatalf("revoking an unknown operator: %v\n%s", err, out)
	}
}

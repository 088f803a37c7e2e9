package server_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/adminclient"
	"github.com/gpurack/gpurack/pxe/server"
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

// TestOperatorLevels: against a running gpuboot, over real mTLS with certificates
// `gpuboot certs operator NAME --level L` issued, each level reaches what it needs and
// no more. A viewer reads but cannot approve a registered machine or revoke anyone; an
// operator approves but cannot revoke or read the audit; an admin revokes, and the
// audit record names who revoked whom, the serial, the reason and the time. The
// revoked operator's next call on a connection it opened before the revocation is
// refused. A token acts as a viewer, and a certificate issued before levels (the
// issued file's old line format) is still found and revoked.
func TestOperatorLevels(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	state := filepath.Join(in.dir, "state")
	issue := func(name, level string) string {
		out := in.run("certs", "operator", name, "--state-dir", state, "--level", level)
		if !strings.Contains(out, "(level "+level+")") {
			t.Fatalf("certs operator %s --level %s:\n%s", name, level, out)
		}
		return filepath.Join(state, "operators", name)
	}
	viewer, oper, adm := issue("vera", "viewer"), issue("oscar", "operator"), issue("ada", "admin")
	bobCreds := issue("bob", "viewer")
	as := func(creds string, args ...string) (string, error) {
		b, err := exec.Command(in.bin, append(args, "--server", in.tlsAddr, "--credentials", creds)...).CombinedOutput()
		return string(b), err
	}
	refused := func(who, creds, need string, args ...string) {
		t.Helper()
		out, err := as(creds, args...)
		if err == nil || !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "needs operator level "+need) ||
			!strings.Contains(out, "--level "+need) {
			t.Errorf("%s: gpuboot %s: %v\n%s\nwant PermissionDenied naming level %s and how to get it", who, strings.Join(args, " "), err, out, need)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent := newTestAgent(1)
	if resp, err := agent.register(ctx, in.enrollClient()); err != nil || resp.GetStatus() != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
		t.Fatalf("register: %v %v; want PENDING (manual approval)", resp, err)
	}
	mac := agent.facts.GetIdentity().GetBootMac()

	// The viewer reads, over gRPC and REST, and is refused every change.
	if out, err := as(viewer, "machines", "list"); err != nil || !strings.Contains(out, mac) {
		t.Fatalf("viewer machines list: %v\n%s", err, out)
	}
	refused("viewer", viewer, "operator", "machines", "approve", mac)
	refused("viewer", viewer, "operator", "machines", "reject", mac, "--reason", "not ours")
	refused("viewer", viewer, "operator", "gossip", "rotate", "r1")
	refused("viewer", viewer, "admin", "operators", "revoke", "bob")
	cert, err := tls.LoadX509KeyPair(filepath.Join(viewer, server.OperatorCertFile), filepath.Join(viewer, server.OperatorKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	vclient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
	resp, err := vclient.Get("https://" + in.tlsAddr + "/racks/r1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("viewer's rack view: HTTP %d", resp.StatusCode)
	}

	// The operator decides on machines but cannot touch credentials.
	refused("operator", oper, "admin", "operators", "revoke", "bob")
	refused("operator", oper, "admin", "operators", "revoke", "vera", "--serial", "01")
	refused("operator", oper, "admin", "operators", "audit")
	if ms := in.listMachines(); len(ms) != 1 || ms[0].GetState() != bootv1.MachineState_MACHINE_STATE_REGISTERED {
		t.Fatalf("after the viewer's refused approve: %v; want the machine still registered", ms)
	}
	if out, err := as(oper, "machines", "approve", mac, "--reason", "racked"); err != nil {
		t.Fatalf("operator approve: %v\n%s", err, out)
	}
	if ms := in.listMachines(); ms[0].GetState() != bootv1.MachineState_MACHINE_STATE_APPROVED {
		t.Fatalf("after the operator's approve: %v", ms[0].GetState())
	}

	// bob holds a connection open from before the revocation.
	bob, closeBob, err := adminclient.DialAdmin(in.tlsAddr, bobCreds)
	if err != nil {
		t.Fatal(err)
	}
	defer closeBob()
	if _, err := bob.ListMachines(ctx, &bootv1.ListMachinesRequest{}); err != nil {
		t.Fatalf("bob before revocation: %v", err)
	}
	if out, err := as(adm, "operators", "audit"); err != nil || !strings.Contains(out, "no operator revocations recorded") {
		t.Fatalf("audit before any revocation: %v\n%s", err, out)
	}
	out, err := as(adm, "operators", "revoke", "bob", "--reason", "left the team")
	if err != nil || !strings.Contains(out, "1 certificate(s) revoked") {
		t.Fatalf("admin revoke bob: %v\n%s", err, out)
	}
	if _, err := bob.ListMachines(ctx, &bootv1.ListMachinesRequest{}); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("bob's next call on his open connection after revocation: %v; want Unauthenticated, revoked", err)
	}

	// The audit says who revoked whom, which serial, why and when.
	serial := issuedSerial(t, state, "bob")
	out, err = as(adm, "operators", "audit", "--json")
	if err != nil {
		t.Fatalf("operators audit: %v\n%s", err, out)
	}
	var audit bootv1.ListOperatorAuditResponse
	if err := protojson.Unmarshal([]byte(out), &audit); err != nil {
		t.Fatalf("operators audit --json: %v\n%s", err, out)
	}
	if len(audit.Entries) != 1 {
		t.Fatalf("audit: %d entries, want 1 (refused attempts revoke nothing):\n%s", len(audit.Entries), out)
	}
	e := audit.Entries[0]
	if e.GetActor() != "operator:ada" || e.GetActorLevel() != "admin" || e.GetOperator() != "bob" || e.GetReason() != "left the team" ||
		len(e.GetSerials()) != 1 || e.GetSerials()[0] != serial || e.GetError() != "" || time.Since(e.GetTime().AsTime()) > time.Minute {
		t.Errorf("audit entry: %v; want ada (admin) revoking bob's %s for \"left the team\", just now", e, serial)
	}
	if out, err := as(adm, "operators", "audit"); err != nil || !strings.Contains(out, "operator:ada") || !strings.Contains(out, serial) {
		t.Errorf("operators audit (table): %v\n%s", err, out)
	}

	// A token acts as a viewer: it reads the REST API whatever the certificate's level.
	out = in.run("certs", "operator", "tess", "--state-dir", state, "--level", "admin", "--token", "--token-ttl", "1h")
	var token string
	for _, line := range strings.Split(out, "\n") {
		if _, tok, ok := strings.Cut(line, "picks it up within a second): "); ok {
			token = strings.TrimSpace(tok)
		}
	}
	time.Sleep(1100 * time.Millisecond) // the token file is looked at once a second at most
	req, _ := http.NewRequest("GET", "https://"+in.tlsAddr+"/api/v1/machines", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := plain.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a token on the REST API: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// A certificate recorded before levels (the old three-field line) is still revoked.
	old := filepath.Join(state, "operators", "issued")
	b, err := os.ReadFile(old)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); f[0] == "vera" {
			l = strings.Join(f[:3], " ") // NAME SERIAL NOT_AFTER: no level=
		}
		lines = append(lines, l)
	}
	if err := os.WriteFile(old, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := as(adm, "operators", "revoke", "vera"); err != nil || !strings.Contains(out, "1 certificate(s) revoked") {
		t.Errorf("revoking an operator recorded in the old line format: %v\n%s", err, out)
	}
	if out, err := as(viewer, "machines", "list"); err == nil {
		t.Errorf("vera's revoked certificate still reads:\n%s", out)
	}
}

// issuedSerial returns the serial gpuboot recorded issuing to name.
func issuedSerial(t *testing.T, state, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "operators", "issued"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[0] == name {
			if f[3] != "level=viewer" && f[3] != "level=operator" && f[3] != "level=admin" {
				t.Errorf("issued line %q: want a level= field", l)
			}
			return f[1]
		}
	}
	t.Fatalf("no serial recorded for %s", name)
	return ""
}

package registryauth

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
)

// A store written before registry passwords existed still loads, and its
// credentials have no registry password: any password is refused.
func TestOldUserStoreLoadsWithoutRegistryPasswords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.json")
	old := `{"credentials":[{"user":"ann","tenant":"a","role":"user","id":"0a1b2c3d","serial":"1f",
"groups":["gpurack:user:ann:0a1b2c3d"],"issuedAt":"2026-01-01T00:00:00Z","notAfter":"2099-01-01T00:00:00Z"}]}`
	os.WriteFile(path, []byte(old), 0o600)
	s, err := tenantusers.LoadStore(path)
	if err != nil || len(s.Credentials) != 1 || s.Credentials[0].RegistryPasswordSHA256 != "" {
		t.Fatalf("old store: %+v %v", s, err)
	}
	for _, pw := range []string{"", HashPassword(""), "x"} {
		if _, ok, _ := Authenticate(s, &RobotStore{}, "ann", pw, time.Now()); ok {
			t.Errorf("password %q accepted for a credential without one", pw)
		}
	}
	if _, err := IssueUserPassword(s, "ffffffff"); err == nil {
		t.Error("a password for a credential that does not exist")
	}
	pw, err := IssueUserPassword(s, "0a1b2c3d")
	if err != nil {
		t.Fatal(err)
	}
	if len(pw) != 43 {
		t.Errorf("password of %d characters, want 43 (32 bytes, base64url)", len(pw))
	}
	s.Save(path)
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), pw) || !strings.Contains(string(data), `"registryPasswordSHA256": "`+HashPassword(pw)+`"`) {
		t.Errorf("store after issuing: %s", data)
	}
	if p, ok, _ := Authenticate(s, &RobotStore{}, "ann", pw, time.Now()); !ok || p.Tenant != "a" || p.Role != RoleUser {
		t.Errorf("ann with her password: %+v %v", p, ok)
	}
}

func TestRobotsAndAuthFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), RobotsFile)
	pw, hash, err := NewPassword()
	if err != nil {
		t.Fatal(err)
	}
	s := &RobotStore{Robots: []Robot{{Tenant: "team-a", PasswordSHA256: hash, IssuedAt: time.Now().UTC()}}}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s, err = LoadRobots(path)
	if err != nil {
		t.Fatal(err)
	}
	users := &tenantusers.Store{}
	if p, ok, _ := Authenticate(users, s, "robot+team-a", pw, time.Now()); !ok || p.Role != RoleRobot || p.Tenant != "team-a" {
		t.Errorf("robot: %+v %v", p, ok)
	}
	if _, ok, reason := Authenticate(users, s, "robot+team-b", pw, time.Now()); ok || !strings.Contains(reason, "team-b") {
		t.Errorf("another tenant's robot name with team-a's password: %v %s", ok, reason)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("robots file mode %v", fi.Mode())
	}
	os.WriteFile(path, []byte("{"), 0o600)
	if _, err := LoadRobots(path); err == nil || !strings.Contains(err.Error(), "tenants apply") {
		t.Errorf("a corrupt robots file: %v", err)
	}

	af, err := AuthFile("10.0.0.1:5000", "alice", "pw")
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Auths map[string]struct{ Auth string } `json:"auths"`
	}
	json.Unmarshal(af, &parsed)
	if got, _ := base64.StdEncoding.DecodeString(parsed.Auths["10.0.0.1:5000"].Auth); string(got) != "alice:pw" {
		t.Errorf("auth file %s", af)
	}
	dc, _ := DockerConfigJSON("10.0.0.1:5000", "robot+team-a", "pw")
	if got, ok := PasswordIn(dc, "10.0.0.1:5000", "robot+team-a"); !ok || got != "pw" {
		t.Errorf("password back from %s: %q %v", dc, got, ok)
	}
	if _, ok := PasswordIn(dc, "10.0.0.2:5000", "robot+team-a"); ok {
		t.Error("a password for another registry address")
	}
}

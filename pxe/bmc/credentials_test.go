package bmc_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
)

func TestCredentials(t *testing.T) {
	srv := redfishtest.New(t, redfishtest.Config{})
	ca := string(srv.CAPEM())
	file := "default:\n  username: admin\n  password: d-pass\n  insecure: true\nracks:\n  r1:\n    username: root\n    password: r1-pass\n    ca: |\n" +
		indent(ca, "      ")
	path := filepath.Join(t.TempDir(), bmc.CredentialsFile)
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := bmc.LoadCredentials(path)
	if err != nil {
		t.Fatalf("LoadCredentials: %v", err)
	}
	ep, err := c.Endpoint("https://10.0.0.5", "r1")
	if err != nil || ep.Username != "root" || ep.Password != "r1-pass" || ep.Insecure || string(ep.CAPEM) != ca || !strings.Contains(ep.CredentialsSource, "rack r1") {
		t.Errorf("rack r1: %+v, %v; want rack r1's account with its CA", ep, err)
	}
	ep, err = c.Endpoint("https://10.0.0.6", "r2")
	if err != nil || ep.Username != "admin" || !ep.Insecure || ep.Address != "https://10.0.0.6" || !strings.Contains(ep.CredentialsSource, "default account") {
		t.Errorf("rack r2: %+v, %v; want the default account", ep, err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bmc.LoadCredentials(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable file: %v, want it refused", err)
	}
	if _, err := bmc.LoadCredentials(filepath.Join(t.TempDir(), "none.yaml")); !bmc.IsNotExist(err) {
		t.Errorf("a missing file: %v, want IsNotExist", err)
	}
	var none *bmc.Credentials
	if _, err := none.Endpoint("https://10.0.0.5", "r1"); !errors.Is(err, bmc.ErrNoCredentials) || !strings.Contains(err.Error(), bmc.CredentialsFile) {
		t.Errorf("no file: %v, want ErrNoCredentials naming the file", err)
	}
	only, err := bmc.ParseCredentials("c.yaml", []byte("racks:\n  r1: {username: a, password: b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := only.Endpoint("https://10.0.0.5", "r9"); !errors.Is(err, bmc.ErrNoCredentials) || !strings.Contains(err.Error(), `rack "r9"`) {
		t.Errorf("a rack without an account: %v", err)
	}
}

func TestParseCredentialsErrors(t *testing.T) {
	for in, want := range map[string]string{
		"default:\n  username: a\n":                        "c.yaml:1: default.password: is required",
		"racks:\n  r1:\n    password: b\n":                 "c.yaml:2: racks[r1].username: is required",
		"default: {username: a, password: b, ca: nope}\n":  "default.ca: is not PEM certificates",
		"default: {username: a, password: b, passwd: c}\n": "passwd",
		"{}\n": "names no account",
		"default: {username: a, password: b}\nextra: true\n": "extra",
	} {
		_, err := bmc.ParseCredentials("c.yaml", []byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCredentials(%q) = %v, want %q", in, err, want)
		}
	}
}

// FuzzParseCredentials: the accounts file parser must not panic, and what it accepts
// has a user and password in every account.
func FuzzParseCredentials(f *testing.F) {
	f.Add([]byte("default:\n  username: admin\n  password: x\n  insecure: true\nracks:\n  r1: {username: a, password: b}\n"))
	f.Add([]byte("racks:\n  r1: {username: a, password: b, ca: \"-----BEGIN CERTIFICATE-----\\nAA==\\n-----END CERTIFICATE-----\\n\"}\n"))
	f.Add([]byte("default: null\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := bmc.ParseCredentials("f.yaml", data)
		if err != nil {
			return
		}
		if c.Default != nil && (c.Default.Username == "" || c.Default.Password == "") {
			t.Errorf("accepted a default account without user or password: %+v", c.Default)
		}
		for r, a := range c.Racks {
			if a.Username == "" || a.Password == "" {
				t.Errorf("accepted rack %q's account without user or password", r)
			}
		}
	})
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

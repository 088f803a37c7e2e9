package registryhosts

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml"
)

const testCA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

// The hosts.toml parses as TOML and says what containerd's hosts.md reads: the server,
// and one host with pull and resolve (no push) and the CA file.
func TestHostsTOML(t *testing.T) {
	text := HostsTOML("10.0.0.2:5000", "/run/x/10.0.0.2:5000/ca.crt")
	tree, err := toml.LoadBytes(text)
	if err != nil {
		t.Fatalf("not TOML: %v\n%s", err, text)
	}
	if got := tree.Get("server"); got != "https://10.0.0.2:5000" {
		t.Errorf("server %v, want https://10.0.0.2:5000\n%s", got, text)
	}
	host := tree.GetPath([]string{"host", "https://10.0.0.2:5000"})
	h, ok := host.(*toml.Tree)
	if !ok {
		t.Fatalf("no [host.\"https://10.0.0.2:5000\"] table:\n%s", text)
	}
	var caps []string
	for _, c := range h.Get("capabilities").([]any) {
		caps = append(caps, c.(string))
	}
	if !slices.Equal(caps, []string{"pull", "resolve"}) || h.Get("ca") != "/run/x/10.0.0.2:5000/ca.crt" {
		t.Errorf("host capabilities %v ca %v:\n%s", caps, h.Get("ca"), text)
	}
}

func TestValidRegistry(t *testing.T) {
	for _, ok := range []string{"10.0.0.2:5000", "registry.site.example:5000", "[fd00::2]:5000"} {
		if err := ValidRegistry(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "10.0.0.2", ":5000", "10.0.0.2:0", "10.0.0.2:65536", "a/b:5000", `a\b:5000`, "..:5000", "https://10.0.0.2:5000"} {
		if err := ValidRegistry(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Apply writes the CA and hosts.toml; a later Apply with another registry removes the
// first one's folder and keeps a folder an operator wrote; an empty registry removes
// what Apply wrote and writes nothing.
func TestApply(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs.d") // missing: Apply makes it
	if removed, err := Apply(dir, "", nil); err != nil || removed != nil {
		t.Fatalf("no registry, no folder: %v, %v", removed, err)
	}
	if _, err := Apply(dir, "10.0.0.2:5000", []byte(testCA)); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "10.0.0.2:5000", CAFile)
	if b, err := os.ReadFile(ca); err != nil || string(b) != testCA {
		t.Fatalf("%s: %q, %v", ca, b, err)
	}
	hosts, err := os.ReadFile(filepath.Join(dir, "10.0.0.2:5000", HostsFile))
	if err != nil || string(hosts) != string(HostsTOML("10.0.0.2:5000", ca)) {
		t.Fatalf("hosts.toml %q, %v", hosts, err)
	}
	operator := filepath.Join(dir, "mirror.example:443")
	if err := os.MkdirAll(operator, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(operator, HostsFile), []byte("server = \"https://mirror.example\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	removed, err := Apply(dir, "registry.site.example:5000", []byte(testCA))
	if err != nil || !slices.Equal(removed, []string{"10.0.0.2:5000"}) {
		t.Fatalf("new registry: removed %v, %v; want the old one", removed, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "10.0.0.2:5000")); !os.IsNotExist(err) {
		t.Errorf("the old registry's folder is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(operator, HostsFile)); err != nil {
		t.Errorf("the operator's hosts.toml is gone: %v", err)
	}
	removed, err = Apply(dir, "", nil)
	if err != nil || !slices.Equal(removed, []string{"registry.site.example:5000"}) {
		t.Fatalf("no registry: removed %v, %v", removed, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "mirror.example:443" {
		t.Errorf("left %v, want the operator's folder only", left)
	}
}

func TestApplyRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := Apply(dir, "10.0.0.2:5000", nil); err == nil || !strings.Contains(err.Error(), "no cluster CA") {
		t.Errorf("no CA: %v", err)
	}
	if _, err := Apply(dir, "../etc:5000", []byte(testCA)); err == nil {
		t.Error("a registry with a slash was accepted")
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a refused Apply wrote %v", left)
	}
}

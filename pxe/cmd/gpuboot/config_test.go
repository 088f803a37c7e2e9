package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
	"github.com/gpurack/gpurack/pxe/server"
)

// rackSite is what `gpuboot config check` is run against: a state directory made by
// gpuboot init, an image store with a signed image, the signing public key, a TFTP
// directory, two racks' manifests and an enroller kubeconfig, all real files in a
// temporary directory, with gpuboot.yaml naming them by relative paths.
type rackSite struct {
	dir, image string
	// Fields of gpuboot.yaml a case changes.
	advertise, policy, enrollment, racks, selectors, cluster string
}

func newRackSite(t *testing.T) *rackSite {
	t.Helper()
	dir := t.TempDir()
	if _, err := server.Init(server.InitOptions{StateDir: filepath.Join(dir, "state"), Advertise: []string{"gpuboot.test", "192.0.2.1"}, Racks: []string{"r1"}}); err != nil {
		t.Fatal(err)
	}
	_, priv, err := manifest.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := manifest.WriteKeyPair(filepath.Join(dir, "signing.key"), filepath.Join(dir, "signing.pub"), priv); err != nil {
		t.Fatal(err)
	}
	image, err := imagetest.Write(filepath.Join(dir, "images"), priv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "state", "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ek := "sha256:" + strings.Repeat("ab", 32)
	files := map[string]string{
		"ipxe/snponly.efi": "ipxe",
		"rack-r1.csv":      "serial,mac,rack,slot,ekHash\nSN-R1-01,52:54:00:00:01:01,r1,U01," + ek + "\n",
		"rack-r2.csv":      "serial,mac,rack,slot,ekHash,bmc\nSN-R2-01,52:54:00:00:02:01,r2,U01,sha256:" + strings.Repeat("cd", 32) + ",https://10.0.2.1\n",
		"enroller.kubeconfig": fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: %s}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, base64.StdEncoding.EncodeToString(ca)),
	}
	for name, content := range files {
		writeFile(t, filepath.Join(dir, name), content, 0o644)
	}
	return &rackSite{dir: dir, image: image, advertise: "gpuboot.test",
		policy:     "{approval: allowlist, allowlist: [rack-r1.csv, rack-r2.csv]}",
		enrollment: "{identity: tpm, reenroll: manual}",
		racks:      fmt.Sprintf("[{name: r1, defaultImage: %s}, {name: r2, defaultImage: %s}]", image, image),
		cluster:    "{kubeconfig: enroller.kubeconfig}",
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// config writes gpuboot.yaml and returns its path.
func (s *rackSite) config(t *testing.T) string {
	t.Helper()
	p := filepath.Join(s.dir, "gpuboot.yaml")
	writeFile(t, p, `stateDir: state
advertise: `+s.advertise+`
interfaces: [{name: lo}]
tftp: {dir: ipxe}
images: {store: images, trustedKeys: [signing.pub]}
enrollment: `+s.enrollment+`
policy: `+s.policy+`
racks: `+s.racks+`
defaultRack: r1
selectors: [`+s.selectors+`]
cluster: `+s.cluster+`
`, 0o644)
	return p
}

// runCheck runs `gpuboot config check --config path` (and args) and returns its
// output and error.
func runCheck(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"config", "check", "--config", path}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// A good configuration passes: every check has its ok line, and the command exits 0.
func TestConfigCheckGood(t *testing.T) {
	s := newRackSite(t)
	s.selectors = fmt.Sprintf("{name: h100, match: {sku: NVIDIA-H100-80GB-HBM3}, image: %s}", s.image)
	path := s.config(t)
	out, err := runCheck(t, path)
	if err != nil {
		t.Fatalf("config check: %v\n%s", err, out)
	}
	d := s.dir
	for _, want := range []string{
		"ok       config      " + path + ": parsed and valid",
		"ok       pki         CA sha256:",
		"ok       inventory   " + filepath.Join(d, "state", "inventory.db") + " does not exist yet: gpuboot serve creates it",
		"ok       allowlist   " + filepath.Join(d, "rack-r1.csv") + ": 1 rows",
		"ok       allowlist   " + filepath.Join(d, "rack-r2.csv") + ": 1 rows",
		"ok       allowlist   2 files merged: no serial, MAC or EK in two of them",
		"ok       policy      approval allowlist, identity tpm, reenroll manual",
		"ok       gossip      rack r1: key ring " + filepath.Join(d, "state", "gossip", "r1.key"),
		"ok       gossip      rack r2: no key yet (" + filepath.Join(d, "state", "gossip", "r2.key") + "): gpuboot serve creates it at start",
		"ok       cluster     cluster.kubeconfig " + filepath.Join(d, "enroller.kubeconfig") + " loaded (API server https://127.0.0.1:6443, not contacted)",
		"ok       images      images.trustedKeys: sha256:",
		"ok       image       " + s.image + " (selector \"h100\", rack r1 defaultImage, rack r2 defaultImage): profile test, signature and 5 artifacts verified",
		"ok       bmc         " + filepath.Join(d, "state", "bmc-credentials.yaml") + " does not exist: power control through BMCs is off",
		"warning  bmc         1 manifest rows of rack r2 name a BMC, but " + filepath.Join(d, "state", "bmc-credentials.yaml") + " does not exist",
		"ok       tokens      operator tokens file " + filepath.Join(d, "state", "operator-tokens") + " readable",
		"ok       tftp        " + filepath.Join(d, "ipxe") + ": 1 files to serve (snponly.efi)",
		"ok       dhcp        proxy mode on lo, answering as 127.0.0.1",
		"no errors, 1 warnings: gpuboot serve can start with this configuration",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Nothing was written: serve, not the check, makes rack r2's gossip key.
	if _, err := os.Stat(filepath.Join(d, "state", "gossip", "r2.key")); !os.IsNotExist(err) {
		t.Errorf("the check wrote rack r2's gossip key (%v)", err)
	}

	// --json: the same findings, counted.
	out, err = runCheck(t, path, "--json")
	var res struct {
		Config           string
		Errors, Warnings int
		Findings         []server.Finding
	}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Config != path || res.Errors != 0 || res.Warnings != 1 || len(res.Findings) < 15 {
		t.Fatalf("--json: %v, %+v\n%s", err, res, out)
	}
}

// Each thing serve refuses, or that keeps machines from booting, is an error line
// saying what to fix, and the command exits non-zero; what serve only warns about is
// a warning line.
func TestConfigCheckFindsProblems(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, s *rackSite)
		want  []string // lines (or their starts) the output must hold
		fails bool
	}{
		{"yaml type", func(t *testing.T, s *rackSite) { s.policy = "{approval: allowlist, allowlist: {r1: rack-r1.csv}}" },
			[]string{"error    config      ", "gpuboot.yaml:7: policy.allowlist: expected a file name or a list of file names, found a mapping"}, true},
		{"machine in two manifests", func(t *testing.T, s *rackSite) {
			writeFile(t, filepath.Join(s.dir, "rack-r2.csv"), "serial,mac,rack\nSN-R2-01,52:54:00:00:02:01,r2\nSN-R1-01,52:54:00:00:02:02,r2\n", 0o644)
		}, []string{"error    allowlist   allowlist " + "DIR/rack-r2.csv line 3: serial \"SN-R1-01\" already listed in DIR/rack-r1.csv line 2"}, true},
		{"manifest missing", func(t *testing.T, s *rackSite) {
			s.policy = "{approval: allowlist, allowlist: [rack-r1.csv, rack-r3.csv]}"
		},
			[]string{"ok       allowlist   DIR/rack-r1.csv: 1 rows", "error    allowlist   allowlist: open DIR/rack-r3.csv: no such file or directory"}, true},
		{"image not in the store", func(t *testing.T, s *rackSite) {
			s.selectors = "{name: canary, match: {rack: r2}, image: " + strings.Repeat("e", 40) + "}"
		}, []string{"error    image       " + strings.Repeat("e", 40) + " (selector \"canary\") is not in the image store DIR/images: copy it there, or name an image that is"}, true},
		{"image signed by another key", func(t *testing.T, s *rackSite) {
			_, other, _ := manifest.GenerateKey()
			id, err := imagetest.Write(filepath.Join(s.dir, "images"), other, map[string][]byte{manifest.ArtifactCmdline: []byte("console=ttyS1\n")})
			if err != nil {
				t.Fatal(err)
			}
			s.racks = fmt.Sprintf("[{name: r1, defaultImage: %s}, {name: r2, defaultImage: %s}]", s.image, id)
		}, []string{"(rack r2 defaultImage) does not verify, so gpuboot serves none of it: verify image DIR/images/"}, true},
		{"rack without an image", func(t *testing.T, s *rackSite) {
			s.racks = fmt.Sprintf("[{name: r1, defaultImage: %s}, {name: r2}]", s.image)
			s.selectors = fmt.Sprintf("{name: r1-h100, match: {rack: r1, sku: h100}, image: %s}", s.image)
		}, []string{"warning  rack        rack r2 has no defaultImage and no selector matches its machines: they boot nothing and wait; set racks[].defaultImage"}, false},
		{"BMC credentials readable by others", func(t *testing.T, s *rackSite) {
			writeFile(t, filepath.Join(s.dir, "state", "bmc-credentials.yaml"), "default: {username: admin, password: pw, insecure: true}\n", 0o644)
		}, []string{"error    bmc         BMC credentials not loaded: power control through BMCs is off until the file is fixed and gpuboot restarted (file=DIR/state/bmc-credentials.yaml, err=BMC credentials DIR/state/bmc-credentials.yaml: mode 0644 lets others read the BMC passwords: chmod 600"}, true},
		{"BMC credentials without the rack", func(t *testing.T, s *rackSite) {
			writeFile(t, filepath.Join(s.dir, "state", "bmc-credentials.yaml"), "racks: {r1: {username: admin, password: pw, insecure: true}}\n", 0o600)
		}, []string{"ok       bmc         DIR/state/bmc-credentials.yaml loaded", "warning  bmc         1 manifest rows of rack r2 name a BMC, but DIR/state/bmc-credentials.yaml has no account for rack r2 and no default"}, false},
		{"kubeconfig unreadable", func(t *testing.T, s *rackSite) { s.cluster = "{kubeconfig: missing.kubeconfig}" },
			[]string{"error    cluster     cluster.kubeconfig: enroller kubeconfig DIR/missing.kubeconfig:"}, true},
		{"no kubeconfig", func(t *testing.T, s *rackSite) { s.cluster = "{}" },
			[]string{"warning  cluster     no cluster.kubeconfig: JoinBundles carry no Kubernetes endpoint or bootstrap token, and the node controller does not run"}, false},
		{"start warnings", func(t *testing.T, s *rackSite) {
			s.policy, s.enrollment = "{approval: auto}", "{identity: tpm-or-fallback}"
		},
			[]string{"warning  policy      approval mode auto: every machine that registers is approved", "warning  enrollment  approval auto with identity tpm-or-fallback",
				"warning  enrollment  reenroll auto with identity tpm-or-fallback"}, false},
		{"start warnings of two manifests", func(t *testing.T, s *rackSite) { s.enrollment = "{}" },
			[]string{"warning  enrollment  approval allowlist with identity mac-uuid-serial: the 2 rows of DIR/rack-r1.csv, DIR/rack-r2.csv that name a TPM EK approve nobody"}, false},
		{"gossip key corrupt", func(t *testing.T, s *rackSite) {
			writeFile(t, filepath.Join(s.dir, "state", "gossip", "r1.key"), "primary zz\n", 0o600)
		}, []string{"error    gossip      rack r1: DIR/state/gossip/r1.key: gossip key ring"}, true},
		{"no state directory", func(t *testing.T, s *rackSite) { os.RemoveAll(filepath.Join(s.dir, "state", "pki")) },
			[]string{"error    pki         load CA:", "run `gpuboot init --state-dir DIR/state --advertise …` first"}, true},
		{"advertise not in the server certificate", func(t *testing.T, s *rackSite) { s.advertise = "gpuboot.example" },
			[]string{`error    pki         the server certificate DIR/state/pki/server.crt does not name advertise "gpuboot.example" (it names gpuboot.test, localhost): agents dial that name and refuse the certificate`}, true},
		{"empty TFTP directory", func(t *testing.T, s *rackSite) { os.Remove(filepath.Join(s.dir, "ipxe", "snponly.efi")) },
			[]string{"error    tftp        tftp: DIR/ipxe holds no files to serve"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newRackSite(t)
			c.setup(t, s)
			out, err := runCheck(t, s.config(t))
			if (err != nil) != c.fails {
				t.Errorf("exit error %v, want failure %v", err, c.fails)
			}
			if c.fails && (err == nil || !strings.Contains(err.Error(), "fix the lines marked error before restarting gpuboot")) {
				t.Errorf("error %v does not say what to do", err)
			}
			for _, want := range c.want {
				if want = strings.ReplaceAll(want, "DIR", s.dir); !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

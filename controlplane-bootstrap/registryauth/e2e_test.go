package registryauth_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
)

// e2eRig is a cluster directory with the pinned registry (distribution v3.1.2) and the
// issuer running as init runs them: the registry on the configuration
// components.RegistryConfig writes, the issuer as the test binary's registry-auth
// subcommand with components.RegistryAuthSpec's flags (testcluster.Main answers it).
type e2eRig struct {
	dir, registry, certDir, policy string
	usersFile, robotsFile          string

	mu        sync.Mutex
	issuerLog bytes.Buffer
}

func (r *e2eRig) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.issuerLog.Write(p)
}

func (r *e2eRig) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.issuerLog.String()
}

func startE2E(t *testing.T) *e2eRig {
	t.Helper()
	bin, err := components.FindBinary(components.BinDir(""), "registry")
	if err != nil {
		testreq.Missing(t, err.Error(), "make k8s-bins builds the registry (docs/registry.md)")
	}
	testreq.Tool(t, "skopeo", "apt-get install skopeo; hack/deps.sh installs it")
	dir := t.TempDir()
	l := components.Layout{Dir: dir}
	r := &e2eRig{dir: dir, certDir: filepath.Join(dir, "certs"), policy: filepath.Join(dir, "policy.json"),
		usersFile: filepath.Join(dir, tenantusers.StoreFile), robotsFile: filepath.Join(dir, registryauth.RobotsFile)}
	ca, err := pki.NewCA(pki.CARequest{CommonName: "e2e-ca"})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue(pki.CertRequest{CommonName: "gpurack-registry", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := pki.EncodeKeyPEM(serving.Key)
	writeFile(t, filepath.Join(r.certDir, "ca.crt"), pki.EncodeCertPEM(ca.Cert))
	writeFile(t, l.PKI(clusterpki.RegistryCert), pki.EncodeCertPEM(serving.Cert))
	writeFile(t, l.PKI(clusterpki.RegistryKey), keyPEM)
	writeFile(t, r.policy, []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`))
	if _, err := registryauth.EnsureSigningKey(l.PKIDir()); err != nil {
		t.Fatal(err)
	}
	ports, err := testcluster.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clusterconfig.Default()
	cfg.APIServer.AdvertiseAddress = "127.0.0.1"
	cfg.Registry.Enabled = true
	cfg.Registry.Port, cfg.Registry.AuthPort, cfg.Registry.MetricsPort = ports[0], ports[1], ports[2]
	r.registry = strings.TrimPrefix(components.RegistryURL(&cfg), "https://")
	conf, err := components.RegistryConfig(&cfg, l, strings.Repeat("5e", 32), false)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, l.RegistryConfigFile(), conf)
	startE2EIssuer(t, r, components.RegistryAuthSpec(l, cfg.APIServer.AdvertiseAddress, cfg.Registry.AuthPort), ca.CertPool())
	startRegistry(t, bin, l.RegistryConfigFile(), r.registry)
	return r
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startE2EIssuer runs the issuer component c as this test binary's subcommand and
// waits until its /healthz answers over TLS for roots.
func startE2EIssuer(t *testing.T, r *e2eRig, c components.Component, roots *x509.CertPool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], c.Args...)
	cmd.Stdout, cmd.Stderr = r, r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		t.Logf("the issuer's log:\n%s", r.log())
	})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(c.HealthURL)
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the issuer did not answer at %s: %v\n%s", c.HealthURL, err, r.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startRegistry(t *testing.T, bin, config, addr string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, "serve", config)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		t.Logf("registry's log (last 4 KiB):\n%s", tail(out.String(), 4096))
	})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("https://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized && strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
				return
			}
			t.Fatalf("the registry's /v2/ without a token: %d %q; want 401 with a Bearer challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry did not answer on %s: %v\n%s", addr, err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// ociLayout writes a one-layer image in OCI layout to dir, tagged tag.
func ociLayout(t *testing.T, dir, tag string) {
	t.Helper()
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	body := []byte("hello from the e2e test\n")
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)})
	tw.Write(body)
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBuf.Bytes())
	zw.Close()
	blob := func(data []byte) (string, int) {
		sum := sha256.Sum256(data)
		d := hex.EncodeToString(sum[:])
		writeFile(t, filepath.Join(dir, "blobs", "sha256", d), data)
		return "sha256:" + d, len(data)
	}
	diffID := sha256.Sum256(tarBuf.Bytes())
	layerDigest, layerSize := blob(gz.Bytes())
	config, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])}}})
	configDigest, configSize := blob(config)
	manifest, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layerDigest, "size": layerSize}}})
	manifestDigest, manifestSize := blob(manifest)
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{map[string]any{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifestDigest, "size": manifestSize,
		"annotations": map[string]string{"org.opencontainers.image.ref.name": tag}}}})
	writeFile(t, filepath.Join(dir, "index.json"), index)
	writeFile(t, filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`))
}

// skopeo runs skopeo with args and returns its combined output and error.
func (r *e2eRig) skopeo(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "skopeo", append([]string{"--policy", r.policy}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+r.dir, "XDG_RUNTIME_DIR="+r.dir)
	out, err := cmd.CombinedOutput()
	t.Logf("$ skopeo %s\n%s", strings.Join(args, " "), out)
	return string(out), err
}

// authFile writes an auth file for name and password and returns its path.
func (r *e2eRig) authFile(t *testing.T, name, password string) string {
	t.Helper()
	data, err := registryauth.AuthFile(r.registry, name, password)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(r.dir, strings.ReplaceAll(name, "+", "-")+".registry-auth.json")
	writeFile(t, path, data)
	return path
}

// TestSkopeoThroughRegistryAndIssuer: the pinned registry with the issuer as its token
// service, and Debian's skopeo as the client with the auth files gpurack writes. A
// user of team-a pushes under team-a/ and is refused under team-b/; team-b's user
// cannot pull team-a's image; team-a's pull credential pulls it and cannot push; a
// revoked user is refused.
//
// skopeo (containers/image, this version and the newest alike) prints only the status
// of a token server's 403, "Requesting bearer token: invalid status code from registry
// 403 (Forbidden)", not its body; it prints the body of a 401. So the refusal's
// message, which docker and containerd (kubelet's pull errors) show, is checked in
// the issuer's answer (TestIssuerOverHTTPS) and here in its log.
func TestSkopeoThroughRegistryAndIssuer(t *testing.T) {
	r := startE2E(t)
	now := time.Now()
	users := &tenantusers.Store{Credentials: []tenantusers.Credential{
		{User: "alice", Tenant: "team-a", Role: tenantusers.RoleUser, ID: "0000000a", NotAfter: now.Add(time.Hour)},
		{User: "bob", Tenant: "team-b", Role: tenantusers.RoleUser, ID: "0000000b", NotAfter: now.Add(time.Hour)},
	}}
	alicePW, _ := registryauth.IssueUserPassword(users, "0000000a")
	bobPW, _ := registryauth.IssueUserPassword(users, "0000000b")
	if err := users.Save(r.usersFile); err != nil {
		t.Fatal(err)
	}
	robotPW, robotHash, _ := registryauth.NewPassword()
	robots := &registryauth.RobotStore{Robots: []registryauth.Robot{{Tenant: "team-a", PasswordSHA256: robotHash, IssuedAt: now}}}
	if err := robots.Save(r.robotsFile); err != nil {
		t.Fatal(err)
	}
	alice, bob := r.authFile(t, "alice", alicePW), r.authFile(t, "bob", bobPW)
	robot := r.authFile(t, registryauth.RobotUser("team-a"), robotPW)
	src := filepath.Join(r.dir, "image")
	ociLayout(t, src, "1")
	certs := []string{"--dest-cert-dir", r.certDir}

	if _, err := r.skopeo(t, append([]string{"copy", "--dest-authfile", alice}, append(certs, "oci:"+src+":1", "docker://"+r.registry+"/team-a/app:1")...)...); err != nil {
		t.Fatalf("alice pushing team-a/app:1: %v", err)
	}
	out, err := r.skopeo(t, append([]string{"copy", "--dest-authfile", alice}, append(certs, "oci:"+src+":1", "docker://"+r.registry+"/team-b/app:1")...)...)
	if err == nil || !strings.Contains(out, "Requesting bearer token: invalid status code from registry 403 (Forbidden)") {
		t.Errorf("alice pushing team-b/app:1: %v; want the issuer's 403", err)
	}
	if want := `denied "alice" (tenant team-a, user)`; !strings.Contains(r.log(), want+" from ") ||
		!strings.Contains(r.log(), "user alice of tenant team-a may push and pull only under team-a/; team-b/app is outside it") {
		t.Errorf("the issuer's log lacks the refusal of alice's push to team-b/app:\n%s", r.log())
	}
	inspect := func(auth, repo string) (string, error) {
		return r.skopeo(t, "inspect", "--authfile", auth, "--cert-dir", r.certDir, "docker://"+r.registry+"/"+repo)
	}
	if out, err := inspect(alice, "team-a/app:1"); err != nil || !strings.Contains(out, `"Digest": "sha256:`) {
		t.Errorf("alice pulling her image: %v", err)
	}
	if out, err := inspect(bob, "team-a/app:1"); err == nil || !strings.Contains(out, "403 (Forbidden)") ||
		!strings.Contains(r.log(), "user bob of tenant team-b may push and pull only under team-b/; team-a/app is outside it") {
		t.Errorf("bob pulling team-a's image: %v; want a 403 and the refusal naming team-b/ in the issuer's log", err)
	}
	if _, err := inspect(robot, "team-a/app:1"); err != nil {
		t.Errorf("team-a's pull credential pulling team-a/app:1: %v", err)
	}
	if out, err := r.skopeo(t, append([]string{"copy", "--dest-authfile", robot}, append(certs, "oci:"+src+":1", "docker://"+r.registry+"/team-a/app:2")...)...); err == nil ||
		!strings.Contains(out, "requested access to the resource is denied") {
		t.Errorf("team-a's pull credential pushing: %v; want the registry's denial (its token grants pull only)", err)
	}

	rev := time.Now().UTC()
	users.Credentials[0].RevokedAt = &rev
	if err := users.Save(r.usersFile); err != nil {
		t.Fatal(err)
	}
	if out, err := inspect(alice, "team-a/app:1"); err == nil || !strings.Contains(out, "invalid username/password: unauthorized: authentication required") {
		t.Errorf("alice after revocation: %v; want unauthorized", err)
	}
}

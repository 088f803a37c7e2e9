package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
)

// TestRegistryTokensPushPullAndGC runs the real registry (distribution v3.1.2) with the
// configuration init writes, under a real supervisor, and real skopeo against it:
//   - no token, or a token signed by a key the registry does not trust: 401 with the
//     realm and service of the challenge; skopeo with a wrong password cannot push;
//   - two images pushed and pulled back through the token protocol, byte for byte;
//   - a monolithic blob upload whose bytes do not match its digest: DIGEST_INVALID;
//   - metrics on the loopback debug address;
//   - gc: the image deleted by its manifest digest loses its blobs from storage, the
//     other still pulls; while gc collects the registry is read-only (a push is 405,
//     a pull works), and read-write again afterwards; a dry run deletes nothing;
//   - gc with the registry stopped collects, an untagged manifest (its tag pushed
//     over) too; gc with a registry that answers but no supervisor runs is refused.
func TestRegistryTokensPushPullAndGC(t *testing.T) {
	r := newRegistryRig(t)
	checkChallenge(t, r)
	a := writeOCIImage(t, filepath.Join(r.dir, "image-a"), "one", "image A: only in tag one\n")
	b := writeOCIImage(t, filepath.Join(r.dir, "image-b"), "two", "image B: only in tag two\n")
	out, err := r.skopeoRun("copy", "--dest-creds", rigUser+":wrong", "--dest-cert-dir", r.certDir, "oci:"+a.dir+":one", r.ref("team/app:denied"))
	if err == nil || !strings.Contains(out, "invalid username/password") {
		t.Errorf("skopeo pushed with a wrong password (err %v):\n%s", err, out)
	}
	r.push(t, a, "team/app:one")
	r.push(t, b, "team/app:two")
	for _, c := range []struct {
		tag string
		img ociImage
	}{{"team/app:one", a}, {"team/app:two", b}} {
		dst, out, err := r.pull(c.tag)
		if err != nil {
			t.Fatalf("skopeo copy from %s: %v\n%s", c.tag, err, out)
		}
		if _, err := os.Stat(filepath.Join(dst, "blobs", "sha256", strings.TrimPrefix(c.img.layer, "sha256:"))); err != nil {
			t.Errorf("%s pulled without its layer %s: %v", c.tag, c.img.layer, err)
		}
	}
	checkCorruptUploadRefused(t, r)
	checkMetrics(t, r)
	checkGCWhileRunning(t, r, a, b)
	checkGCStoppedAndForeign(t, r, a, b)
}

// checkChallenge: the registry asks for a token of the realm and service init wrote.
func checkChallenge(t *testing.T, r *registryRig) {
	resp, _ := r.do(t, http.MethodGet, r.url("/v2/"), nil)
	want := fmt.Sprintf(`Bearer realm="%s",service="%s"`, components.RegistryRealm(r.cfg), components.RegistryService)
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != want {
		t.Errorf("GET /v2/ without a token: %d %q, want 401 %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), want)
	}
	stranger := r.signer
	r.signer = newTokenSigner(t, "") // a key whose certificate is not the rootcertbundle
	resp, body := r.do(t, http.MethodGet, r.url("/v2/"), nil, tokenAccess{Type: "repository", Name: "team/app", Actions: []string{"pull"}})
	r.signer = stranger
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v2/ with a token of an untrusted key: %d %s, want 401", resp.StatusCode, body)
	}
	if resp, body := r.do(t, http.MethodGet, r.url("/v2/"), nil, tokenAccess{}); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/ with a trusted token: %d %s", resp.StatusCode, body)
	}
}

// checkCorruptUploadRefused: a monolithic upload (POST, then PUT with ?digest=) whose
// bytes are not the digest's is refused with DIGEST_INVALID and stores nothing.
func checkCorruptUploadRefused(t *testing.T, r *registryRig) {
	push := tokenAccess{Type: "repository", Name: "team/app", Actions: []string{"pull", "push"}}
	resp, body := r.do(t, http.MethodPost, r.url("/v2/team/app/blobs/uploads/"), nil, push)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || loc == "" {
		t.Fatalf("start an upload: %d %s", resp.StatusCode, body)
	}
	if !strings.HasPrefix(loc, "https://") {
		loc = r.url(loc)
	}
	claimed := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("the layer as it was built")))
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	resp, body = r.do(t, http.MethodPut, loc+sep+"digest="+claimed, []byte("the layer as it arrived, corrupted"), push)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "DIGEST_INVALID") {
		t.Errorf("PUT of bytes that do not match %s: %d %s, want 400 DIGEST_INVALID", claimed, resp.StatusCode, body)
	}
	if resp, _ := r.do(t, http.MethodHead, r.url("/v2/team/app/blobs/"+claimed), nil, push); resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD of the refused blob: %d, want 404", resp.StatusCode)
	}
}

// checkMetrics: Prometheus metrics on the loopback debug address the contract names.
func checkMetrics(t *testing.T, r *registryRig) {
	resp, err := http.Get("http://" + components.RegistryMetricsAddr(r.cfg) + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(b.String(), "registry_http_requests_total") {
		t.Errorf("metrics at %s: %d, no registry_http_requests_total", components.RegistryMetricsAddr(r.cfg), resp.StatusCode)
	}
}

// manifestDigest is the digest the registry serves repoTag's manifest under.
func manifestDigest(t *testing.T, r *registryRig, repo, tag string) string {
	resp, body := r.do(t, http.MethodHead, r.url("/v2/"+repo+"/manifests/"+tag), nil, tokenAccess{Type: "repository", Name: repo, Actions: []string{"pull"}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD manifest %s:%s: %d %s", repo, tag, resp.StatusCode, body)
	}
	return resp.Header.Get("Docker-Content-Digest")
}

func checkGCWhileRunning(t *testing.T, r *registryRig, a, b ociImage) {
	digest := manifestDigest(t, r, "team/app", "one")
	if digest != a.manifest {
		t.Errorf("tag one's manifest is %s in the registry, %s as pushed", digest, a.manifest)
	}
	out, err := r.skopeoRun("delete", "--creds", rigUser+":"+rigPassword, "--cert-dir", r.certDir, r.ref("team/app@"+digest))
	if err != nil {
		t.Fatalf("skopeo delete %s: %v\n%s", digest, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	dry, err := CollectGarbage(ctx, r.dir, GCOptions{DryRun: true, Out: &progress})
	if err != nil || dry.ReadOnly || dry.Blobs < 2 || dry.Manifests != 0 {
		t.Fatalf("dry run: %+v %v\n%s", dry, err, progress.String())
	}
	if _, err := os.Stat(r.blobPath(a.layer)); err != nil {
		t.Fatalf("the dry run deleted %s: %v", a.layer, err)
	}
	pid := r.cp.Supervisor.PID(components.Registry)
	var during []string
	res, err := CollectGarbage(ctx, r.dir, GCOptions{Out: &progress, whileReadOnly: func() error {
		pushTo := tokenAccess{Type: "repository", Name: "team/app", Actions: []string{"pull", "push"}}
		resp, _ := r.do(t, http.MethodPost, r.url("/v2/team/app/blobs/uploads/"), nil, pushTo)
		during = append(during, fmt.Sprintf("push %d", resp.StatusCode))
		if _, out, err := r.pull("team/app:two"); err != nil {
			during = append(during, "pull failed: "+out)
		}
		return nil
	}})
	t.Logf("gc:\n%s", progress.String())
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	if !res.ReadOnly || res.Blobs != dry.Blobs || strings.Join(during, "; ") != "push 405" {
		t.Errorf("gc %+v (dry run found %d blobs); while read-only: %v, want push 405 and the pull working", res, dry.Blobs, during)
	}
	if now := r.cp.Supervisor.PID(components.Registry); now == pid {
		t.Errorf("the registry was not restarted (pid %d)", pid)
	}
	for _, d := range []string{a.layer, a.config, a.manifest} {
		if _, err := os.Stat(r.blobPath(d)); !os.IsNotExist(err) {
			t.Errorf("blob %s of the deleted image is still in storage (%v)", d, err)
		}
	}
	for _, d := range []string{b.layer, b.config, b.manifest} {
		if _, err := os.Stat(r.blobPath(d)); err != nil {
			t.Errorf("blob %s of the kept image: %v", d, err)
		}
	}
	if _, out, err := r.pull("team/app:two"); err != nil {
		t.Errorf("tag two after gc: %v\n%s", err, out)
	}
	if cfg, _ := os.ReadFile(r.l.RegistryConfigFile()); strings.Contains(string(cfg), "Read-only while") {
		t.Errorf("the configuration stayed read-only:\n%s", cfg)
	}
	r.push(t, a, "team/app:again") // read-write again
}

// checkGCStoppedAndForeign: with no supervisor, a registry that answers is refused; a
// stopped one is collected, and a manifest whose tag was pushed over (untagged) goes
// with its blobs.
func checkGCStoppedAndForeign(t *testing.T, r *registryRig, a, b ociImage) {
	r.push(t, b, "team/app:again") // A's manifest loses its only tag
	r.cp.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	foreign := exec.Command(r.bin, "serve", r.l.RegistryConfigFile())
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	spec, _ := components.Spec(r.cfg, r.l, components.Registry)
	for i := 0; !r.cp.prober().Probe(ctx, spec, time.Second).OK; i++ {
		if i > 100 {
			t.Fatal("the registry started by hand did not come up")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err := CollectGarbage(ctx, r.dir, GCOptions{})
	foreign.Process.Kill()
	foreign.Wait()
	if err == nil || !strings.Contains(err.Error(), "stop it, then run `controlplane-bootstrap registry gc") {
		t.Errorf("gc beside a registry no supervisor runs: %v, want a refusal", err)
	}
	var progress bytes.Buffer
	res, err := CollectGarbage(ctx, r.dir, GCOptions{Out: &progress})
	if err != nil || res.ReadOnly || res.Blobs != 3 || res.Manifests != 1 || !strings.Contains(progress.String(), "the registry is stopped") {
		t.Fatalf("gc of the stopped registry: %+v %v\n%s", res, err, progress.String())
	}
	if _, err := os.Stat(r.blobPath(a.layer)); !os.IsNotExist(err) {
		t.Errorf("layer %s is still in storage after the stopped gc (%v)", a.layer, err)
	}
}

// TestCollectGarbageSaysWhatToFix: gc on a folder that is no cluster directory, or on a
// cluster without the registry, says so and touches nothing.
func TestCollectGarbageSaysWhatToFix(t *testing.T) {
	dir := t.TempDir()
	if _, err := CollectGarbage(context.Background(), dir, GCOptions{}); err == nil || !strings.Contains(err.Error(), "give the --dir init used") {
		t.Errorf("gc of an empty folder: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte("registry:\n  enabled: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CollectGarbage(context.Background(), dir, GCOptions{}); err == nil || !strings.Contains(err.Error(), "registry.enabled is false") {
		t.Errorf("gc without the registry: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("gc wrote into the folder: %v", entries)
	}
}

// TestWriteRegistryFilesMakesTheSigningKey: init with the registry on makes the token
// issuer's signing pair and the HTTP secret once and keeps them; a signing certificate
// that is not its key's stops init with what is wrong; the configuration is private.
func TestWriteRegistryFilesMakesTheSigningKey(t *testing.T) {
	l := components.Layout{Dir: t.TempDir()}
	cfg, err := clusterconfig.Parse("cluster.yaml", []byte("registry:\n  enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := writeRegistryFiles(l, cfg); err != nil {
		t.Fatal(err)
	}
	cert, _ := os.ReadFile(l.PKI(components.RegistryTokenCert))
	if _, _, err := registryauth.LoadSigningKey(l.PKI(registryauth.SigningKeyFile), l.PKI(components.RegistryTokenCert)); err != nil {
		t.Fatalf("the signing pair init made: %v", err)
	}
	first, _ := os.ReadFile(l.PKI(components.RegistryHTTPSecret))
	if err := writeRegistryFiles(l, cfg); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(l.PKI(components.RegistryHTTPSecret))
	if len(first) < 64 || string(first) != string(again) {
		t.Errorf("HTTP secret %q, then %q: want 32 random bytes, kept", first, again)
	}
	if certAgain, _ := os.ReadFile(l.PKI(components.RegistryTokenCert)); len(cert) == 0 || string(cert) != string(certAgain) {
		t.Error("the signing certificate was not kept across inits")
	}
	st, err := os.Stat(l.RegistryConfigFile())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("configuration %v %v, want mode 0600 (it holds the secret)", st, err)
	}
	if data, _ := os.ReadFile(l.RegistryConfigFile()); !strings.Contains(string(data), strings.TrimSpace(string(first))) {
		t.Error("the configuration lacks the secret")
	}
	if st, err := os.Stat(filepath.Join(l.Dir, "registry")); err != nil || !st.IsDir() {
		t.Errorf("storage folder: %v", err)
	}
	newTokenSigner(t, l.PKI(components.RegistryTokenCert)) // another key's certificate
	if err := writeRegistryFiles(l, cfg); err == nil || !strings.Contains(err.Error(), "signing key") {
		t.Errorf("a signing certificate not of its key: %v, want init to stop", err)
	}
}

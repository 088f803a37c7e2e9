package main

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/internal/testreq"
)

// copyTinyContainer copies testdata/container-tiny (profile, lock, script) into a
// temporary folder, with the profile edited by edit, and returns the profile's path.
func copyTinyContainer(t *testing.T, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"tiny.yaml", "tiny.lock.json", "hello.sh"} {
		data, err := os.ReadFile(filepath.Join("testdata", "container-tiny", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "tiny.yaml" && edit != nil {
			data = []byte(edit(string(data)))
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "tiny.yaml")
}

// TestContainerBadInput: a container profile with a mistake, or a stale or missing
// lock, is refused before anything is built, naming the field or the lock, and an
// earlier archive at --out is left as it was.
func TestContainerBadInput(t *testing.T) {
	cases := []struct {
		name string
		edit func(string) string
		rm   string
		want string
	}{
		{"root user", func(s string) string { return strings.Replace(s, "uid: 1000", "uid: 0", 1) }, "", "tiny.yaml:17: image.user.uid: is 0 (root, or left out); the image must not run as root"},
		{"root name", func(s string) string { return strings.Replace(s, "name: app", "name: root", 1) }, "", "image.user.name: the image must not run as root"},
		{"unknown field", func(s string) string { return strings.Replace(s, "  tag:", "  tags: [x]\n  tag:", 1) }, "", `tiny.yaml:16: image.tags: unknown field "tags"`},
		{"missing file", func(s string) string { return strings.Replace(s, "source: hello.sh", "source: hello2.sh", 1) }, "", "tiny.yaml:11: files[0].source: hello2.sh does not exist"},
		{"bad image name", func(s string) string { return strings.Replace(s, "gpurack.example/ci/tiny", "Tiny", 1) }, "", `image.name: "Tiny" must start with a registry host`},
		{"stale lock", func(s string) string { return strings.Replace(s, "GREETING: hello", "GREETING: hi", 1) }, "", "tiny.lock.json is stale: the profile changed since it was locked"},
		{"missing lock", nil, "tiny.lock.json", "has no lock file"},
		{"out is a directory", nil, "", "is a directory; name the archive file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prof := copyTinyContainer(t, c.edit)
			if c.rm != "" {
				os.Remove(filepath.Join(filepath.Dir(prof), c.rm))
			}
			out := filepath.Join(filepath.Dir(prof), "tiny.oci.tar")
			earlier := []byte("an earlier archive")
			os.WriteFile(out, earlier, 0o644)
			os.WriteFile(out+".sig", earlier, 0o644)
			target := out
			if c.edit == nil && c.rm == "" {
				target = filepath.Dir(prof)
			}
			stdout, stderr, code := runGPUImage("container", "build", prof, "--out", target, "--cache", t.TempDir())
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, want a failure saying %q:\n%s%s", code, c.want, stdout, stderr)
			}
			for _, f := range []string{out, out + ".sig"} {
				if got, _ := os.ReadFile(f); !bytes.Equal(got, earlier) {
					t.Errorf("%s was changed by a failed build", f)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(prof), ".tiny*")); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// TestContainerTinyImage locks the tiny container profile against the live archive,
// builds it twice for the same manifest digest and archive bytes, checks the archive
// with ociarchive.Inspect and gpuimage container verify, reads the config and layer
// back, and runs the image's entrypoint as its user in a chroot of the layer.
func TestContainerTinyImage(t *testing.T) {
	testreq.Root(t, "gpuimage container build (mmdebstrap --mode=root)")
	for _, tool := range []string{"mmdebstrap", "apt-get", "dpkg-deb", "dpkg-query", "chroot", "tar"} {
		testreq.Tool(t, tool, "run make deps")
	}
	prof := copyTinyContainer(t, nil)
	dir := filepath.Dir(prof)
	cache := build.DefaultCacheDir()
	t.Log(mustRun(t, "lock", prof, "--cache", cache))
	t.Log(mustRun(t, "lock", "--check", prof, "--cache", cache))
	priv, pub := filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub.pem")
	mustRun(t, "keygen", priv, pub)

	// Build b is also pushed, to a registry behind TLS and basic auth.
	host, push, trust := testRegistry(t, dir)
	var digests []string
	for _, name := range []string{"a", "b"} {
		start := time.Now()
		args := []string{"container", "build", prof, "--out", filepath.Join(dir, name+".oci.tar"), "--cache", cache, "--key", priv}
		if name == "b" {
			args = append(args, push...)
		}
		out := mustRun(t, args...)
		t.Logf("build %s took %s:\n%s", name, time.Since(start).Round(time.Second), lastLines(out, 8))
		i := strings.Index(out, "manifest sha256:")
		if i < 0 {
			t.Fatalf("no manifest digest in the output:\n%s", out)
		}
		digests = append(digests, strings.Fields(out[i:])[1])
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of one profile and lock: manifest %s and %s", digests[0], digests[1])
	}
	checkPushed(t, trust, host+"/ci/tiny:1", digests[0])
	a, b := sha256File(t, filepath.Join(dir, "a.oci.tar")), sha256File(t, filepath.Join(dir, "b.oci.tar"))
	if a != b {
		t.Fatalf("two builds give different archives: %s %s", a, b)
	}
	t.Logf("manifest %s and archive sha256:%s identical across two builds", digests[0], a)

	f, err := ociarchive.InspectFile(filepath.Join(dir, "a.oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Format != ociarchive.FormatOCI || f.Images != 1 || strings.Join(f.Names, " ") != "gpurack.example/ci/tiny:1" {
		t.Fatalf("inspect: %+v", f.Archive)
	}
	t.Log(mustRun(t, "container", "verify", filepath.Join(dir, "a.oci.tar"), "--pubkey", pub))
	os.WriteFile(filepath.Join(dir, "a.oci.tar.sig"), bytes.Repeat([]byte{1}, 64), 0o644)
	if _, stderr, code := runGPUImage("container", "verify", filepath.Join(dir, "a.oci.tar"), "--pubkey", pub); code != 1 || !strings.Contains(stderr, "FAIL") {
		t.Fatalf("a bad signature verified: exit %d %s", code, stderr)
	}
	checkTinyContents(t, filepath.Join(dir, "b.oci.tar"))
}

// checkTinyContents reads the image back with go-containerregistry and runs its
// entrypoint as its user.
func checkTinyContents(t *testing.T, archive string) {
	layoutDir := t.TempDir()
	if out, err := exec.Command("tar", "-xf", archive, "-C", layoutDir).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v %s", err, out)
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "1000:1000" || c.WorkingDir != "/work" || strings.Join(c.Entrypoint, " ") != "/usr/local/bin/hello" || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Fatalf("config: %+v", cf)
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok || c.Labels["org.opencontainers.image.title"] != "tiny" {
		t.Fatalf("config ports %v labels %v", c.ExposedPorts, c.Labels)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v", len(layers), err)
	}
	d, _ := layers[0].Digest()
	root := t.TempDir()
	blob := filepath.Join(layoutDir, "blobs", "sha256", d.Hex)
	if out, err := exec.Command("tar", "-xzf", blob, "-C", root, "--numeric-owner").CombinedOutput(); err != nil {
		t.Fatalf("untar the layer: %v %s", err, out)
	}
	out, err := exec.Command("chroot", "--userspec=1000:1000", root, "/bin/sh", "-c", "cd /work && GREETING=hello /usr/local/bin/hello && touch /work/ok && grep '^app:x:1000:1000:' /etc/passwd").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello from 1000:1000 in /work") {
		t.Fatalf("run the entrypoint as the image's user: %v\n%s", err, out)
	}
	t.Logf("entrypoint as 1000:1000: %s", strings.TrimSpace(string(out)))
}

// TestLintContainerProfiles: lint reads the sample workload profiles and their locks.
func TestLintContainerProfiles(t *testing.T) {
	paths, _ := filepath.Glob("../../../profiles/workloads/*.yaml")
	out, errOut, code := runGPUImage(append([]string{"lint"}, paths...)...)
	if len(paths) < 3 || code != 0 || strings.Count(out, "ok  ") != len(paths) || !strings.Contains(out, "lock ok") {
		t.Fatalf("lint of %v: code %d\n%s%s", paths, code, out, errOut)
	}
	prof := copyTinyContainer(t, func(s string) string { return strings.Replace(s, "GREETING: hello", "GREETING: hi", 1) })
	if _, errOut, code := runGPUImage("lint", prof); code != 1 || !strings.Contains(errOut, "profileDigest: stale") {
		t.Fatalf("lint of a stale container profile: code %d %s", code, errOut)
	}
}

// testRegistry starts go-containerregistry's registry behind TLS and basic auth (ci,
// secret) and returns its host and the build flags that push to it, with a CA file and
// a containers auth file written in dir, and a transport that trusts it.
func testRegistry(t *testing.T, dir string) (string, []string, http.RoundTripper) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "secret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ca, auth := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "auth.json")
	host := strings.TrimPrefix(srv.URL, "https://")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	cred := base64.StdEncoding.EncodeToString([]byte("ci:secret"))
	if err := os.WriteFile(auth, []byte(`{"auths": {"`+host+`": {"auth": "`+cred+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return host, []string{"--push", host + "/ci/tiny:1", "--ca", ca, "--authfile", auth}, srv.Client().Transport
}

// checkPushed reads ref's manifest digest from the test registry.
func checkPushed(t *testing.T, trust http.RoundTripper, ref, want string) {
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r, remote.WithTransport(trust), remote.WithAuth(&authn.Basic{Username: "ci", Password: "secret"}))
	if err != nil {
		t.Fatalf("read back the pushed image: %v", err)
	}
	if desc.Digest.String() != want {
		t.Fatalf("the registry holds %s, the build made %s", desc.Digest, want)
	}
	t.Logf("pushed %s@%s", ref, want)
}

package controlplane

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
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
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
)

// registryRig is a cluster directory with the registry enabled, its files written by
// init's own writeRegistryFiles, the real registry binary under a real supervisor that
// takes restart requests (as `init --foreground` runs it), and a token endpoint of the
// test's own at the realm. The token endpoint stands in for the registry-auth
// component: it grants whatever scope a client with the test's password asks for, in
// ES256 tokens with an x5c header whose self-signed certificate is the registry's
// rootcertbundle (pki/registry-token.crt, written here as registryauth would).
type registryRig struct {
	dir, bin, skopeo string
	l                components.Layout
	cfg              *clusterconfig.Config
	cp               *ControlPlane
	signer           tokenSigner
	certDir          string // the cluster CA, for skopeo's --cert-dir
	client           *http.Client
	log              *lockedLog
}

const rigUser, rigPassword = "ci", "pw-for-the-test"

func newRegistryRig(t *testing.T) *registryRig {
	t.Helper()
	return newRegistryRigAt(t, "127.0.0.1")
}

// newRegistryRigAt is newRegistryRig with the registry and its token endpoint on
// address (apiServer.advertiseAddress), which must be this host's.
func newRegistryRigAt(t *testing.T, address string) *registryRig {
	t.Helper()
	bin, err := components.FindBinary(components.BinDir(""), components.Registry)
	if err != nil {
		testreq.Missing(t, err.Error(), "make k8s-bins builds distribution's registry v3.1.2 (hack/k8s-bins.sh, group registry)", "GPURACK_K8S_REQUIRED") // testcluster.RequiredEnv, which this package cannot import
	}
	r := &registryRig{bin: bin, dir: t.TempDir(), log: &lockedLog{}}
	r.skopeo = testreq.Tool(t, "skopeo", "apt-get install skopeo (hack/deps.sh installs it)")
	r.l = components.Layout{Dir: r.dir}
	tokenLn, err := net.Listen("tcp", net.JoinHostPort(address, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tokenLn.Close() })
	yml := fmt.Sprintf("apiServer:\n  advertiseAddress: %s\nregistry:\n  enabled: true\n  port: %d\n  authPort: %d\n  metricsPort: %d\n",
		address, freePort(t), tokenLn.Addr().(*net.TCPAddr).Port, freePort(t))
	if r.cfg, err = clusterconfig.Parse("cluster.yaml", []byte(yml)); err != nil {
		t.Fatal(err)
	}
	data, _ := r.cfg.Marshal()
	if err := os.WriteFile(r.l.ConfigFile(), data, 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := clusterpki.Ensure(r.l.PKIDir(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeRegistryFiles(r.l, r.cfg); err != nil {
		t.Fatal(err)
	}
	// The test mints its tokens with the signing pair init made (registryauth's).
	key, cert, err := registryauth.LoadSigningKey(r.l.PKI(registryauth.SigningKeyFile), r.l.PKI(components.RegistryTokenCert))
	if err != nil {
		t.Fatal(err)
	}
	r.signer = tokenSigner{key: key, cert: cert}
	r.certDir = filepath.Join(r.dir, "skopeo-certs")
	os.MkdirAll(r.certDir, 0o700)
	os.WriteFile(filepath.Join(r.certDir, "ca.crt"), set.CACertPEM(), 0o644)
	pool := x509.NewCertPool()
	pool.AddCert(set.CA.Cert)
	r.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	r.serveTokens(t, tokenLn)
	r.startSupervised(t, set)
	return r
}

// startSupervised starts the registry as init --foreground does, with this test process
// as the directory's supervisor (its PID file and restart socket).
func (r *registryRig) startSupervised(t *testing.T, set *clusterpki.Set) {
	t.Helper()
	cp := &ControlPlane{Layout: r.l, Config: r.cfg, PKI: set, readyTimeout: time.Minute}
	cp.Supervisor = components.NewSupervisor(r.log.printf)
	spec, _ := components.Spec(r.cfg, r.l, components.Registry)
	var out bytes.Buffer
	if err := cp.startForeground(context.Background(), []components.Component{spec}, map[string]string{components.Registry: r.bin}, &out, time.Minute); err != nil {
		cp.Stop()
		t.Fatalf("start the registry: %v\n%s", err, components.TailFile(r.l.LogFile(components.Registry), 20))
	}
	if err := writePIDFile(r.l.SupervisorPIDFile(), os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if err := cp.serveRestarts(r.log.printf); err != nil {
		t.Fatal(err)
	}
	r.cp = cp
	t.Cleanup(func() {
		cp.Stop()
		if t.Failed() {
			t.Logf("supervisor:\n%s\nregistry log:\n%s", r.log.String(), components.TailFile(r.l.LogFile(components.Registry), 12))
		}
	})
}

func (r *registryRig) url(path string) string { return components.RegistryURL(r.cfg) + path }
func (r *registryRig) ref(repoTag string) string {
	return "docker://" + strings.TrimPrefix(components.RegistryURL(r.cfg), "https://") + "/" + repoTag
}

// skopeoRun runs skopeo with the test's credentials and the cluster CA for every
// registry it talks to, and returns its combined output.
func (r *registryRig) skopeoRun(args ...string) (string, error) {
	full := []string{"--insecure-policy"}
	full = append(full, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.skopeo, full...).CombinedOutput()
	return string(out), err
}

// push copies the OCI layout image to repoTag in the registry.
func (r *registryRig) push(t *testing.T, img ociImage, repoTag string) {
	t.Helper()
	out, err := r.skopeoRun("copy", "--dest-creds", rigUser+":"+rigPassword, "--dest-cert-dir", r.certDir,
		"oci:"+img.dir+":"+img.tag, r.ref(repoTag))
	if err != nil {
		t.Fatalf("skopeo copy to %s: %v\n%s", repoTag, err, out)
	}
}

// pull copies repoTag out of the registry into a new OCI layout and returns its folder.
func (r *registryRig) pull(repoTag string) (string, string, error) {
	dst := filepath.Join(r.dir, "pulled-"+strings.NewReplacer("/", "-", ":", "-").Replace(repoTag)+fmt.Sprint(time.Now().UnixNano()))
	out, err := r.skopeoRun("copy", "--src-creds", rigUser+":"+rigPassword, "--src-cert-dir", r.certDir, r.ref(repoTag), "oci:"+dst+":pulled")
	return dst, out, err
}

// do sends a request to the registry with a token for access (none when empty).
func (r *registryRig) do(t *testing.T, method, url string, body []byte, access ...tokenAccess) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(access) > 0 {
		req.Header.Set("Authorization", "Bearer "+r.signer.mint(t, access))
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp, b.String()
}

// blobPath is where the filesystem driver keeps a blob's bytes.
func (r *registryRig) blobPath(digest string) string {
	hexd := strings.TrimPrefix(digest, "sha256:")
	return filepath.Join(components.RegistryStorage(r.cfg, r.l), "docker", "registry", "v2", "blobs", "sha256", hexd[:2], hexd, "data")
}

// serveTokens answers the realm: Basic rigUser:rigPassword gets a token for every scope
// asked (Docker's token protocol: GET ?service=&scope=; docs/registry.md).
func (r *registryRig) serveTokens(t *testing.T, ln net.Listener) {
	kp, err := tls.LoadX509KeyPair(r.l.PKI(clusterpki.RegistryCert), r.l.PKI(clusterpki.RegistryKey))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, req *http.Request) {
		user, pw, ok := req.BasicAuth()
		if !ok || user != rigUser || pw != rigPassword || req.URL.Query().Get("service") != components.RegistryService {
			http.Error(w, `{"details":"wrong user, password or service"}`, http.StatusUnauthorized)
			return
		}
		var access []tokenAccess
		for _, s := range req.URL.Query()["scope"] {
			f := strings.Split(s, ":")
			if len(f) == 3 {
				access = append(access, tokenAccess{Type: f[0], Name: f[1], Actions: strings.Split(f[2], ",")})
			}
		}
		tok := r.signer.mint(t, access)
		json.NewEncoder(w).Encode(map[string]any{"token": tok, "access_token": tok, "expires_in": 300, "issued_at": time.Now().UTC().Format(time.RFC3339)})
	})
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{kp}}, ErrorLog: nil}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
}

// tokenAccess is one entry of a token's access claim (the registry's JWT spec).
type tokenAccess struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

// tokenSigner mints the registry's bearer tokens as the token issuer does: a JWS
// (RFC 7515) compact serialization, ES256 (RFC 7518 §3.4: r||s, 32 bytes each), its
// header's x5c the signing certificate.
type tokenSigner struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

// newTokenSigner makes a self-signed P-256 signing certificate and writes it to
// certPath, where the registry's rootcertbundle points.
func newTokenSigner(t *testing.T, certPath string) tokenSigner {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: components.RegistryIssuer},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	if certPath != "" {
		if err := os.WriteFile(certPath, pki.EncodeCertPEM(cert), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tokenSigner{key: key, cert: cert}
}

// mint signs a token for access, for the registry's service, valid five minutes.
func (s tokenSigner) mint(t *testing.T, access []tokenAccess) string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	header, _ := json.Marshal(map[string]any{"alg": "ES256", "typ": "JWT", "x5c": []string{base64.StdEncoding.EncodeToString(s.cert.Raw)}})
	now := time.Now()
	jti := make([]byte, 8)
	rand.Read(jti)
	claims, _ := json.Marshal(map[string]any{"iss": components.RegistryIssuer, "sub": rigUser, "aud": components.RegistryService,
		"exp": now.Add(5 * time.Minute).Unix(), "nbf": now.Add(-5 * time.Second).Unix(), "iat": now.Unix(), "jti": hex.EncodeToString(jti),
		"access": access})
	input := b64(header) + "." + b64(claims)
	sum := sha256.Sum256([]byte(input))
	rr, ss, err := ecdsa.Sign(rand.Reader, s.key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	rr.FillBytes(sig[:32])
	ss.FillBytes(sig[32:])
	return input + "." + b64(sig)
}

// ociImage is a one-layer image in an OCI image layout folder (image-spec's
// image-layout.md), as skopeo's oci: transport reads it.
type ociImage struct {
	dir, tag                string
	manifest, config, layer string // digests
}

// writeOCIImage writes an image whose single layer holds one file with content, which
// its config also carries as the label "content".
func writeOCIImage(t *testing.T, dir, tag, content string) ociImage {
	t.Helper()
	return writeOCIImageLabelled(t, dir, tag, content, content)
}

// writeOCIImageLabelled is writeOCIImage with the label's value given (a large layer's
// content would pass the config size clients accept).
func writeOCIImageLabelled(t *testing.T, dir, tag, content, label string) ociImage {
	t.Helper()
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(0, 0)})
	tw.Write([]byte(content))
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBuf.Bytes())
	zw.Close()
	img := ociImage{dir: dir, tag: tag}
	blob := func(data []byte) (string, int) {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(data))
		p := filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return d, len(data)
	}
	var size int
	img.layer, size = blob(gz.Bytes())
	config, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux", "config": map[string]any{"Labels": map[string]string{"content": label}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{fmt.Sprintf("sha256:%x", sha256.Sum256(tarBuf.Bytes()))}}})
	var cfgSize int
	img.config, cfgSize = blob(config)
	manifest, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": img.config, "size": cfgSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": img.layer, "size": size}}})
	var mSize int
	img.manifest, mSize = blob(manifest)
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{map[string]any{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": img.manifest, "size": mSize,
		"annotations": map[string]string{"org.opencontainers.image.ref.name": tag}}}})
	os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644)
	os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	return img
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// lockedLog collects the supervisor's lines, which come from its goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, format+"\n", args...)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

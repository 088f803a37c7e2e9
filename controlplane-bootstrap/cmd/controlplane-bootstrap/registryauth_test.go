package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// testRegistry is the registry address the CLI tests give --registry.
const testRegistry = "192.0.2.10:5000"

// issuerProcess is `controlplane-bootstrap registry-auth` run by the test on loopback
// for the cluster in c.Dir, as init would run it.
type issuerProcess struct {
	url    string
	client *http.Client
}

func startIssuerProcess(t *testing.T, c *testcluster.Cluster) *issuerProcess {
	t.Helper()
	pkiDir := c.ControlPlane().Layout.PKIDir()
	signingCert, err := registryauth.EnsureSigningKey(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	set, err := clusterpki.Load(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := set.CA.Issue(pki.CertRequest{CommonName: "gpurack-registry", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyPEM, _ := pki.EncodeKeyPEM(serving.Key)
	atomicfile.Write(filepath.Join(dir, "registry.crt"), pki.EncodeCertPEM(serving.Cert), 0o644)
	atomicfile.Write(filepath.Join(dir, "registry.key"), keyPEM, 0o600)
	ports, err := testcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(os.Args[0], registryauth.Command, "--listen", listen,
		"--cert", filepath.Join(dir, "registry.crt"), "--key", filepath.Join(dir, "registry.key"),
		"--signing-cert", signingCert, "--signing-key", filepath.Join(pkiDir, registryauth.SigningKeyFile),
		"--users-file", filepath.Join(c.Dir, "users", "credentials.json"), "--robots-file", filepath.Join(c.Dir, registryauth.RobotsFile))
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	logFile := filepath.Join(dir, "issuer.log")
	lf, _ := os.Create(logFile)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		lf.Close()
		log, _ := os.ReadFile(logFile)
		t.Logf("registry-auth's log:\n%s", log)
	})
	p := &issuerProcess{url: "https://" + listen, client: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: set.CA.CertPool()}}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := p.client.Get(p.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry-auth did not answer on %s: %v", listen, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// token asks for scope with the credentials of authFile (for testRegistry, as skopeo
// --authfile reads them) and returns the status and body.
func (p *issuerProcess) token(t *testing.T, authFile, scope string) (int, string) {
	t.Helper()
	data, err := os.ReadFile(authFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Auths map[string]struct{ Username, Password string } `json:"auths"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("auth file %s: %v", authFile, err)
	}
	a := f.Auths[testRegistry]
	req, _ := http.NewRequest(http.MethodGet, p.url+"/token?"+url.Values{"service": {registryauth.Service}, "scope": {scope}}.Encode(), nil)
	req.SetBasicAuth(a.Username, a.Password)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// checkTenantPullSecret checks that ns has the pull Secret for testRegistry and its
// default ServiceAccount names it.
func checkTenantPullSecret(t *testing.T, c *testcluster.Cluster, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := c.Clientset(t)
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, registryauth.PullSecretName, metav1.GetOptions{})
	if err != nil || s.Type != corev1.SecretTypeDockerConfigJson || !strings.Contains(string(s.Data[corev1.DockerConfigJsonKey]), testRegistry) {
		t.Errorf("pull secret in %s: %v %v", ns, s, err)
	}
	sa, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
	if err != nil || len(sa.ImagePullSecrets) == 0 || sa.ImagePullSecrets[0].Name != registryauth.PullSecretName {
		t.Errorf("serviceaccount %s/default: %v %v", ns, sa, err)
	}
}

// TestRegistryAddress: --registry wins and must be HOST:PORT; without it the address is
// cluster.yaml's (advertise address and registry.port) when the registry is enabled,
// and none otherwise.
func TestRegistryAddress(t *testing.T) {
	cfg := clusterconfig.Default()
	cfg.APIServer.AdvertiseAddress = "192.0.2.10"
	cp := &controlplane.ControlPlane{Config: &cfg}
	for _, tc := range []struct {
		flag    string
		enabled bool
		want    string
		wantErr bool
	}{
		{"", false, "", false},
		{"", true, "192.0.2.10:5000", false},
		{"registry.example:443", true, "registry.example:443", false},
		{"[2001:db8::1]:5000", false, "[2001:db8::1]:5000", false},
		{"192.0.2.10", true, "", true},
		{"https://192.0.2.10:5000", false, "", true},
		{":5000", false, "", true},
	} {
		cfg.Registry.Enabled = tc.enabled
		got, err := registryAddress(tc.flag, cp)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("registryAddress(%q, enabled %v) = %q, %v; want %q (error %v)", tc.flag, tc.enabled, got, err, tc.want, tc.wantErr)
		}
	}
}

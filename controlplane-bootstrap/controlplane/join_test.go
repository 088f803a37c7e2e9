package controlplane_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// bootstrapClient authenticates with a bootstrap token, as a joining kubelet does.
func bootstrapClient(t *testing.T, c *testcluster.Cluster, token string) kubernetes.Interface {
	t.Helper()
	cfg := &rest.Config{Host: c.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// joinNode does a kubelet's TLS bootstrap with client-go: a node-client CSR
// with the token, approved by the controller-manager and signed by the
// cluster CA, then a client with the issued certificate that registers the
// Node. It returns that node's client.
func joinNode(t *testing.T, c *testcluster.Cluster, token, node string) (kubernetes.Interface, error) {
	t.Helper()
	ctx := ctxFor(t, 90*time.Second)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err := certutil.MakeCSR(key, &pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	boot := bootstrapClient(t, c, token)
	name, uid, err := csr.RequestCertificateWithContext(ctx, boot, csrPEM, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
	if err != nil {
		return nil, err
	}
	certPEM, err := csr.WaitForCertificate(ctx, boot, name, uid)
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if got := certs[0].Subject.CommonName; got != "system:node:"+node {
		t.Errorf("issued certificate CN %q", got)
	}
	if err := certs[0].CheckSignatureFrom(c.ControlPlane().PKI.CA.Cert); err != nil {
		t.Errorf("issued certificate is not signed by the cluster CA: %v", err)
	}
	nodeClient, err := kubernetes.NewForConfig(&rest.Config{Host: c.Server, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM, CertData: certPEM, KeyData: keyPEM}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		c.Clientset(t).CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	return nodeClient, nil
}

func TestClientGoJoinAndNodeRestriction(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	nodeA, err := joinNode(t, c, token, "join-node-a")
	if err != nil {
		t.Fatalf("join node a: %v", err)
	}
	if _, err := joinNode(t, c, token, "join-node-b"); err != nil {
		t.Fatalf("join node b: %v", err)
	}
	ctx := ctxFor(t, time.Minute)
	// The node may label itself...
	self := []byte(`{"metadata":{"labels":{"gpurack.io/test":"yes"}}}`)
	if _, err := nodeA.CoreV1().Nodes().Patch(ctx, "join-node-a", types.StrategicMergePatchType, self, metav1.PatchOptions{}); err != nil {
		t.Errorf("node a labelling itself: %v", err)
	}
	// ...but not touch another node (NodeRestriction)...
	_, err = nodeA.CoreV1().Nodes().Patch(ctx, "join-node-b", types.StrategicMergePatchType, self, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not allowed to modify node") {
		t.Errorf("node a patching node b: %v, want NodeRestriction's Forbidden", err)
	}
	// ...nor change its own taints (docs/contracts.md §5: that is gpuboot's job).
	taint := []byte(`{"spec":{"taints":[{"key":"gpurack.io/unvalidated","effect":"NoSchedule"}]}}`)
	_, err = nodeA.CoreV1().Nodes().Patch(ctx, "join-node-a", types.StrategicMergePatchType, taint, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node a changing its own taints: %v, want Forbidden", err)
	}
	// Its CSR was approved by the controller-manager, not by us.
	csrs, err := c.Clientset(t).CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approved := 0
	for _, r := range csrs.Items {
		for _, cond := range r.Status.Conditions {
			if cond.Type == certificatesv1.CertificateApproved && strings.Contains(cond.Reason, "AutoApproved") {
				approved++
			}
		}
	}
	if approved < 2 {
		t.Errorf("%d auto-approved CSRs, want at least 2", approved)
	}
}

func TestRevokedTokenCannotJoin(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	id, _, _ := strings.Cut(token, ".")
	cs := c.Clientset(t)
	ctx := ctxFor(t, 2*time.Minute)
	if err := joinconfig.RevokeToken(ctx, cs, id); err != nil {
		t.Fatal(err)
	}
	if err := joinconfig.WaitRevoked(ctx, c.RESTConfig(t), token); err != nil {
		t.Fatalf("token still accepted after revoke: %v", err)
	}
	_, err := joinNode(t, c, token, "revoked-node")
	if !apierrors.IsUnauthorized(err) {
		t.Fatalf("join with a revoked token: %v, want Unauthorized", err)
	}
	// kube-controller-manager's bootstrap signer drops the signature on its next
	// sync, not at once: wait for that, up to a minute.
	key := "jws-kubeconfig-" + id
	deadline := time.Now().Add(time.Minute)
	for {
		cm, err := cs.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, "cluster-info", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, signed := cm.Data[key]; !signed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster-info is still signed with the revoked token (%s) a minute after the revoke", key)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func TestClusterInfoJWSVerifies(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	id, secret, _ := strings.Cut(token, ".")
	// Read it the way kubeadm discovery does: anonymously.
	anon, err := kubernetes.NewForConfig(&rest.Config{Host: c.Server, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM}})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := anon.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctxFor(t, 30*time.Second), bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("anonymous read of cluster-info: %v", err)
	}
	content := cm.Data[bootstrapapi.KubeConfigKey]
	sig := cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id]
	if !jws.DetachedTokenIsValid(sig, content, id, secret) {
		t.Fatalf("cluster-info signature for %s does not verify", id)
	}
	if jws.DetachedTokenIsValid(sig, content, id, "0123456789abcdef") {
		t.Fatal("cluster-info signature verifies with the wrong secret")
	}
	kc, err := clientcmd.Load([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		if cl.Server != c.Config.EndpointURL() || string(cl.CertificateAuthorityData) != string(c.CAPEM) {
			t.Errorf("cluster-info kubeconfig: server %s, CA match %v", cl.Server, string(cl.CertificateAuthorityData) == string(c.CAPEM))
		}
	}
	// Anonymous users may read nothing else.
	if _, err := anon.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctxFor(t, 30*time.Second), joinconfig.KubeadmConfigMap, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("anonymous read of kubeadm-config: %v, want Forbidden", err)
	}
}

func TestKubeadmJoinDryRunPassesDiscovery(t *testing.T) {
	testcluster.Require(t, "kubeadm")
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	kubeadm, err := components.FindBinary(components.BinDir(""), "kubeadm")
	if err != nil {
		t.Fatal(err)
	}
	run := func(hash string) (string, error) {
		ctx := ctxFor(t, 2*time.Minute)
		cmd := exec.CommandContext(ctx, kubeadm, "join", c.Config.APIServer.Endpoint,
			"--token", token, "--discovery-token-ca-cert-hash", hash,
			"--dry-run", "--ignore-preflight-errors=all", "--node-name", "kubeadm-dry-run", "-v=1")
		// kubeadm's dry run writes its files here instead of /etc/kubernetes/tmp.
		cmd.Env = append(os.Environ(), "KUBEADM_JOIN_DRYRUN_DIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(c.CAPin)
	if err != nil {
		t.Fatalf("kubeadm join --dry-run: %v\n%s", err, tail(out, 40))
	}
	for _, want := range []string{
		"Cluster info signature and contents are valid and TLS certificate validates against pinned roots",
		`Reading configuration from the "kubeadm-config" ConfigMap`,
		"clusterName: testcluster",
		"podSubnet: " + c.Config.Networking.PodSubnet,
		`download the KubeletConfiguration from ConfigMap "kubelet-config"`,
		"cgroupDriver: systemd",
		"This node has joined the cluster",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("kubeadm output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("kubeadm output:\n%s", tail(out, 60))
	}
	// A wrong CA pin must fail discovery.
	out, err = run("sha256:" + strings.Repeat("00", 32))
	if err == nil || !strings.Contains(out, "none of the public keys") {
		t.Errorf("kubeadm join with a wrong CA hash: err %v\n%s", err, tail(out, 10))
	}
	if _, err := os.Stat("/etc/kubernetes/kubelet.conf"); err == nil {
		t.Error("the dry run wrote /etc/kubernetes/kubelet.conf")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

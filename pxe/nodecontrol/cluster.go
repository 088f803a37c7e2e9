// Package nodecontrol is gpuboot's Kubernetes side, acting with the enroller credential
// (CONTRACTS §4, §5): it mints and deletes the per-machine bootstrap tokens and deletes
// Nodes (Cluster, which pxe/enroll uses), and it watches Nodes (Controller): it tells
// the enrollment service when a joining machine's Node registers, removes
// gpurack.io/unvalidated once the machine is ready, and sets gpurack.io/gpu-unhealthy
// while the Node's GPUHealthy condition is False, removing it when the condition is
// True. It mirrors the condition and adds no hysteresis: the agent's is the only one
// (it holds GPUHealthy False until its checks have been better for --clear-after;
// decision 0205).
//
// It does not write labels or conditions: the agent owns those (NodeRestriction). The
// names it reads and writes are internal/nodecontract's.
package nodecontrol

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Bootstrap token conventions (kubeadm; CONTRACTS §4).
const (
	tokenNamespace   = "kube-system"
	tokenSecretType  = corev1.SecretType("bootstrap.kubernetes.io/token")
	tokenSecretPrefx = "bootstrap-token-"
	// NodeTokenGroup is the extra group of every per-machine token.
	NodeTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
)

// Cluster implements pxe/enroll.Cluster with the enroller kubeconfig.
type Cluster struct {
	client   kubernetes.Interface
	endpoint string
	caPEM    string
	now      func() time.Time
}

// Load reads the enroller kubeconfig at path. The API endpoint and CA nodes get in their
// JoinBundle are the kubeconfig's (CONTRACTS §4).
func Load(path string) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("enroller kubeconfig %s: %w", path, err)
	}
	return FromRESTConfig(cfg)
}

// FromRESTConfig builds a Cluster from a client configuration.
func FromRESTConfig(cfg *rest.Config) (*Cluster, error) {
	ca := cfg.TLSClientConfig.CAData
	if len(ca) == 0 && cfg.TLSClientConfig.CAFile != "" {
		b, err := os.ReadFile(cfg.TLSClientConfig.CAFile)
		if err != nil {
			return nil, fmt.Errorf("enroller kubeconfig: cluster CA: %w", err)
		}
		ca = b
	}
	if len(ca) == 0 {
		return nil, errors.New("enroller kubeconfig: no certificate-authority-data: nodes need the cluster CA in their JoinBundle")
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "gpuboot"
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("enroller kubeconfig: %w", err)
	}
	return &Cluster{client: client, endpoint: cfg.Host, caPEM: string(ca), now: time.Now}, nil
}

// Client returns the Kubernetes client.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// Endpoint implements enroll.Cluster.
func (c *Cluster) Endpoint() string { return c.endpoint }

// CAPEM implements enroll.Cluster.
func (c *Cluster) CAPEM() string { return c.caPEM }

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomToken(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = tokenAlphabet[int(b[i])%len(tokenAlphabet)]
	}
	return string(b)
}

// MintBootstrapToken implements enroll.Cluster: a kubeadm-form token "[a-z0-9]{6}.[a-z0-9]{16}"
// stored as Secret kube-system/bootstrap-token-ID, usages authentication and signing,
// extra group NodeTokenGroup, expiring after ttl.
func (c *Cluster) MintBootstrapToken(ctx context.Context, nodeName string, ttl time.Duration) (string, string, error) {
	for attempt := 0; attempt < 3; attempt++ {
		id, secret := randomToken(6), randomToken(16)
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: tokenSecretPrefx + id, Namespace: tokenNamespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuboot"}},
			Type: tokenSecretType,
			StringData: map[string]string{
				"description":                    "gpuboot: node " + nodeName,
				"token-id":                       id,
				"token-secret":                   secret,
				"expiration":                     c.now().Add(ttl).UTC().Format(time.RFC3339),
				"usage-bootstrap-authentication": "true",
				"usage-bootstrap-signing":        "true",
				"auth-extra-groups":              NodeTokenGroup,
			},
		}
		_, err := c.client.CoreV1().Secrets(tokenNamespace).Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("create bootstrap token for %s: %w", nodeName, err)
		}
		return id, id + "." + secret, nil
	}
	return "", "", fmt.Errorf("create bootstrap token for %s: three id collisions", nodeName)
}

// DeleteBootstrapToken implements enroll.Cluster.
func (c *Cluster) DeleteBootstrapToken(ctx context.Context, id string) error {
	err := c.client.CoreV1().Secrets(tokenNamespace).Delete(ctx, tokenSecretPrefx+id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete bootstrap token %s: %w", id, err)
	}
	return nil
}

// DeleteNode implements enroll.Cluster.
func (c *Cluster) DeleteNode(ctx context.Context, name string) error {
	err := c.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Node %s: %w", name, err)
	}
	return nil
}

// Names of what `controlplane-bootstrap tenants apply` writes that gpuboot reads
// (controlplane-bootstrap/tenants; a test there keeps them equal).
const (
	// TenantLabel names a tenant object's tenant.
	TenantLabel = "gpurack.io/tenant"
	// TenantQuotaName is the name of a tenant namespace's ResourceQuota.
	TenantQuotaName = "gpurack-quota"
	// QuotaGPU is the quota's GPU resource.
	QuotaGPU corev1.ResourceName = "requests.nvidia.com/gpu"
)

// GPUQuota is a tenant's GPU quota summed over its namespaces: the quota's hard limit
// and what the quota controller last counted as used.
type GPUQuota struct{ Hard, Used int64 }

// TenantGPUQuotas reads every tenant's GPU quota from the ResourceQuotas `tenants
// apply` writes (the enroller's read grant on ResourceQuotas). Tenants whose quotas
// set no GPU limit are left out.
func (c *Cluster) TenantGPUQuotas(ctx context.Context) (map[string]GPUQuota, error) {
	list, err := c.client.CoreV1().ResourceQuotas(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: TenantLabel})
	if err != nil {
		return nil, fmt.Errorf("list the tenants' ResourceQuotas: %w", err)
	}
	out := map[string]GPUQuota{}
	for _, q := range list.Items {
		hard, ok := q.Spec.Hard[QuotaGPU]
		if q.Name != TenantQuotaName || !ok {
			continue
		}
		t := out[q.Labels[TenantLabel]]
		t.Hard += hard.Value()
		if used, ok := q.Status.Used[QuotaGPU]; ok {
			t.Used += used.Value()
		}
		out[q.Labels[TenantLabel]] = t
	}
	return out, nil
}

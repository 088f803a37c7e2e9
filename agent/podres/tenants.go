package podres

import (
	"context"
	"os"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// TenantLabel is the namespace label naming its tenant, as `controlplane-bootstrap
// tenants apply` sets it (tenants.LabelTenant; a test there keeps the two equal).
const TenantLabel = "gpurack.io/tenant"

// Tenants names namespaces' tenants from their TenantLabel, reading each namespace
// from the apiserver at most every MaxAge. It reads with kubelet's node kubeconfig
// (namespaces are in the node's read-only grant gpurack:node-policy-reader) once
// kubelet has written it. A namespace it cannot read has no tenant until it can, tried
// again after MaxAge.
type Tenants struct {
	// Kubeconfig is kubelet's node kubeconfig; Client, when set, is used instead.
	Kubeconfig string
	Client     kubernetes.Interface
	// MaxAge is how long a namespace's tenant is kept; 0: one minute.
	MaxAge time.Duration

	mu    sync.Mutex
	cache map[string]tenantEntry
}

type tenantEntry struct {
	tenant string
	at     time.Time
}

func (t *Tenants) client() kubernetes.Interface {
	if t.Client != nil {
		return t.Client
	}
	if _, err := os.Stat(t.Kubeconfig); err != nil || t.Kubeconfig == "" {
		return nil // not joined yet
	}
	rc, err := clientcmd.BuildConfigFromFlags("", t.Kubeconfig)
	if err != nil {
		return nil
	}
	rc.UserAgent = "gpuagent-tenants"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil
	}
	t.Client = cs
	return cs
}

// Of is namespace ns's tenant, or "" when it has none or cannot be read.
func (t *Tenants) Of(ctx context.Context, ns string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	maxAge := t.MaxAge
	if maxAge == 0 {
		maxAge = time.Minute
	}
	if e, ok := t.cache[ns]; ok && time.Since(e.at) < maxAge {
		return e.tenant
	}
	cs := t.client()
	if cs == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tenant := ""
	// A namespace that cannot be read is kept as of no tenant for MaxAge too, so an
	// apiserver that does not answer costs the heartbeat one wait per namespace per
	// MaxAge, not one per heartbeat.
	if n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		tenant = n.Labels[TenantLabel]
	}
	if t.cache == nil {
		t.cache = map[string]tenantEntry{}
	}
	t.cache[ns] = tenantEntry{tenant: tenant, at: time.Now()}
	return tenant
}

// Allocation is h as a heartbeat reports it: one holder per container and GPU, each
// with its namespace's tenant (tenantOf), sorted by GPU UUID.
func Allocation(ctx context.Context, h Holders, tenantOf func(context.Context, string) string) *machinev1.GPUAllocation {
	uuids := make([]string, 0, len(h))
	for uuid := range h {
		uuids = append(uuids, uuid)
	}
	sort.Strings(uuids)
	a := &machinev1.GPUAllocation{}
	for _, uuid := range uuids {
		for _, c := range h[uuid] {
			a.Holders = append(a.Holders, &machinev1.GPUHolder{GpuUuid: uuid, Namespace: c.Namespace, Pod: c.Pod,
				Container: c.Container, Tenant: tenantOf(ctx, c.Namespace)})
		}
	}
	return a
}

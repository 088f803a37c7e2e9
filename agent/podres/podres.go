// Package podres reads which containers hold which GPUs from kubelet's pod-resources
// API (k8s.io/kubelet/pkg/apis/podresources/v1, the socket kubelet serves at
// <kubelet dir>/pod-resources/kubelet.sock), as dcgm-exporter does, so that the
// agent's per-GPU metrics can say which pod, namespace and container use each GPU.
// A namespace's tenant is joined where namespaces are known (controlplane-bootstrap
// tenants status exports gpurack_tenant_namespace; docs/tenants.md).
package podres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpurack/gpurack/agent/deviceplugin"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// Socket is the pod-resources socket under kubelet's root directory.
func Socket(kubeletDir string) string {
	return filepath.Join(kubeletDir, "pod-resources", "kubelet.sock")
}

// ErrNoKubelet: there is no pod-resources socket, so no kubelet runs here (simulation
// mode, or before the join).
var ErrNoKubelet = errors.New("no kubelet pod-resources socket")

// Holder is a container that was allocated a GPU.
type Holder struct {
	Namespace, Pod, Container string
}

// Holders maps each GPU's UUID to the containers it is allocated to, sorted; under
// time-slicing one GPU can have several (its replicas' holders, each once).
type Holders map[string][]Holder

// List asks kubelet at socket which containers hold nvidia.com/gpu devices. Replica
// device IDs (<UUID>::<r>) count for their GPU.
func List(ctx context.Context, socket string) (Holders, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("%w (%s): %v", ErrNoKubelet, socket, err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources List on %s: %w", socket, err)
	}
	return holders(resp), nil
}

func holders(resp *podresourcesapi.ListPodResourcesResponse) Holders {
	out := Holders{}
	for _, pr := range resp.GetPodResources() {
		for _, c := range pr.GetContainers() {
			h := Holder{Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName()}
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != nodecontract.ResourceGPU {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					uuid := deviceplugin.GPUOfDevice(id)
					if !slices.Contains(out[uuid], h) {
						out[uuid] = append(out[uuid], h)
					}
				}
			}
		}
	}
	for _, hs := range out {
		slices.SortFunc(hs, func(a, b Holder) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container))
		})
	}
	return out
}

// Cache answers Holders from one List at most every MaxAge, so that scrapes of the
// agent's /metrics, which anyone may make, do not each cost kubelet a call (kubelet
// limits pod-resources to 100 calls a second for everything on the node).
type Cache struct {
	Socket string
	// MaxAge is how long an answer is reused; default 5 s.
	MaxAge time.Duration

	mu   sync.Mutex
	at   time.Time
	last Holders
	err  error
}

// Holders is List through the cache, with a 2 s limit on the call.
func (c *Cache) Holders(ctx context.Context) (Holders, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	age := c.MaxAge
	if age <= 0 {
		age = 5 * time.Second
	}
	if !c.at.IsZero() && time.Since(c.at) < age {
		return c.last, c.err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c.last, c.err = List(ctx, c.Socket)
	c.at = time.Now()
	return c.last, c.err
}

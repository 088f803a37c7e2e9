//go:build linux

package qemu

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/testreq"
)

// TestTwoNodeHostGW (make e2e, GPURACK_E2E_HOSTGW=1) is TestRack's pod network
// across nodes with flannel's other backend, host-gw (routes instead of vxlan),
// chosen in gpuboot's cluster.podNetwork and carried by the JoinBundle: two machines
// of the tiny image boot at once, both Nodes become Ready (startRack also checks that
// each node started flannel with host-gw), and a pod on one reaches a pod on the other
// by pod IP and through a ClusterIP Service. About 7 minutes on 2 cores.
func TestTwoNodeHostGW(t *testing.T) {
	testreq.OptIn(t, "GPURACK_E2E_HOSTGW", "a second pod network across two QEMU nodes, with flannel host-gw, about 7 minutes: TestRack runs vxlan in CI; make e2e runs both")
	r := startRack(t, RackOptions{PodNetwork: "host-gw", Machines: []MachineSpec{
		{Node: "gpu-r1-a", MAC: "52:54:00:e2:e0:21", IP: "10.0.2.21", Serial: "GPR-TWO-0001", UUID: "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e21"},
		{Node: "gpu-r1-b", MAC: "52:54:00:e2:e0:23", IP: "10.0.2.23", Serial: "GPR-TWO-0003", UUID: "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e23"},
	}})
	a, b := r.Machines[0].node, r.Machines[1].node
	if a.Spec.PodCIDR == b.Spec.PodCIDR {
		t.Fatalf("both Nodes have podCIDR %s", a.Spec.PodCIDR)
	}
	crossNodeFetch(t, r.ctx, r.admin, a, b, "host-gw")
}

// crossNodeFetch runs the probe's HTTP server in a pod on node b behind a ClusterIP
// Service, then a pod on node a that fetches it by pod IP and through the Service.
// kube-proxy on node a programs the Service a moment after its EndpointSlice appears,
// so the client pod is tried up to three times; every attempt is logged.
func crossNodeFetch(t *testing.T, ctx context.Context, admin kubernetes.Interface, a, b *corev1.Node, backend string) {
	t.Helper()
	got, svc := startProbeServer(t, ctx, admin, b, metav1.NamespaceDefault, "probe-server")
	byIP := fmt.Sprintf("http://%s:8080/", got.Status.PodIP)
	bySvc := fmt.Sprintf("http://%s/", svc.Spec.ClusterIP)
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		done, err := runPodToEnd(ctx, admin, probePod(a, fmt.Sprintf("probe-client-%d", attempt), "fetch", byIP, bySvc), 3*time.Minute)
		if err == nil {
			t.Logf("%s: a pod on %s (%s) fetched a pod on %s (%s) by pod IP and through ClusterIP %s (attempt %d):\n%s",
				backend, a.Name, done.Status.PodIP, b.Name, got.Status.PodIP, svc.Spec.ClusterIP, attempt, terminationMessage(done))
			return
		}
		lastErr = err
		t.Logf("attempt %d: %v", attempt, err)
		time.Sleep(10 * time.Second)
	}
	t.Fatalf("%s: a pod on %s never reached the pod on %s (%s, %s): %v", backend, a.Name, b.Name, byIP, bySvc, lastErr)
}

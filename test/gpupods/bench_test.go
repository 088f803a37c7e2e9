//go:build linux

package gpupods

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// BenchmarkFaultToWithdrawnKubelet: an XID 79 on gpu3 of the simulator → the agent's
// NVML event watch and checklist → gpu3 withdrawn → the device plugin's ListAndWatch →
// a real kubelet → the Node's allocatable nvidia.com/gpu 7 in the apiserver, seen
// through a watch on the Node (each update arrives as it is written: no polling, and no
// client-side rate limit in the path). One op is 5 faults; ns/op is their mean, max-ms the slowest.
// Untimed after each: the fault cleared, the GPU reset, the hysteresis (2 s) and 8
// allocatable again.
//
// Two kubelets side by side: nodeStatusUpdateFrequency as gpuagent sets it
// (kubejoin.NodeStatusUpdateFrequency) and kubelet's default (10 s), the peer.
func BenchmarkFaultToWithdrawnKubelet(b *testing.B) {
	for _, c := range []struct{ name, every string }{
		{"status-every-" + kubejoin.NodeStatusUpdateFrequency + "-gpurack", kubejoin.NodeStatusUpdateFrequency},
		{"status-every-10s-kubelet-default", ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			g := newGPUNode(b, ctx, gpuNodeOptions{name: "gpu-bench", statusEvery: c.every})
			_, stop := g.startPlugin(1)
			defer stop()
			g.hn.WaitReady(b, ctx)
			awaitAllocatable(b, ctx, g.cs, g.hn, 8, "the device plugin's 8 GPUs")
			const faults = 5
			var worst, sum time.Duration
			n := 0
			for b.Loop() {
				for range faults {
					b.StopTimer()
					w := watchNode(b, ctx, g.cs, g.hn.Name)
					b.StartTimer()
					t0 := time.Now()
					if _, err := g.sim.Inject(sim.Fault{Kind: sim.KindXID, GPU: 3, Value: 79}, 0); err != nil {
						b.Fatal(err)
					}
					awaitAllocatableEvent(b, w, 7, "gpu3 withdrawn")
					d := time.Since(t0)
					worst, sum, n = max(worst, d), sum+d, n+1
					w.Stop()
					b.StopTimer()
					g.sim.Clear()
					g.mon.GPUsReset([]int{3})
					awaitAllocatable(b, ctx, g.cs, g.hn, 8, "gpu3 back")
					b.StartTimer()
				}
			}
			// The mean of what each fault took, from the injection to the watch event
			// (the watch's setup and the recovery are outside it).
			b.ReportMetric(float64(sum.Nanoseconds())/float64(n), "ns/fault")
			b.ReportMetric(float64(worst.Milliseconds()), "max-ms")
		})
	}
}

// watchNode opens a watch on Node name, from now (the current resourceVersion).
func watchNode(b *testing.B, ctx context.Context, cs kubernetes.Interface, name string) watch.Interface {
	b.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: n.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// awaitAllocatableEvent reads w until a Node update shows allocatable nvidia.com/gpu
// want.
func awaitAllocatableEvent(b *testing.B, w watch.Interface, want int64, what string) {
	b.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("%s: the Node watch ended", what)
			}
			if n, ok := ev.Object.(*corev1.Node); ok {
				if q, ok := n.Status.Allocatable[nodecontract.ResourceGPU]; ok && q.Value() == want {
					return
				}
			}
		case <-timeout:
			b.Fatalf("%s: no Node update with allocatable %s %d in 2 minutes", what, nodecontract.ResourceGPU, want)
		}
	}
}

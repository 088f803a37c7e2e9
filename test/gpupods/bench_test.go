//go:build linux

package gpupods

import (
	"context"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/kubejoin"
)

// BenchmarkFaultToWithdrawnKubelet: an XID 79 on gpu3 of the simulator → the agent's
// NVML event watch and checklist → gpu3 withdrawn → the device plugin's ListAndWatch →
// a real kubelet → the Node's allocatable nvidia.com/gpu 7 in the apiserver (polled
// every 20 ms). One op is 5 faults; ns/op is their mean, max-ms the slowest.
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
			var worst time.Duration
			for b.Loop() {
				for range faults {
					t0 := time.Now()
					if _, err := g.sim.Inject(sim.Fault{Kind: sim.KindXID, GPU: 3, Value: 79}, 0); err != nil {
						b.Fatal(err)
					}
					awaitAllocatable(b, ctx, g.cs, g.hn, 7, "gpu3 withdrawn")
					worst = max(worst, time.Since(t0))
					b.StopTimer()
					g.sim.Clear()
					g.mon.GPUsReset([]int{3})
					awaitAllocatable(b, ctx, g.cs, g.hn, 8, "gpu3 back")
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*faults), "ns/fault")
			b.ReportMetric(float64(worst.Milliseconds()), "max-ms")
		})
	}
}

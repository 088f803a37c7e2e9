package deviceplugin

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// BenchmarkAllocate is kubelet's Allocate call as kubelet makes it: gRPC over the
// plugin's unix socket, one container asking for 2 of the 8 GPUs of a simulated DGX
// H100 (a different pair each time), answered with CDI devices and the annotation. The
// plugin runs with the agent's monitor checking every 100 ms beside it. p50-ns and
// p99-ns are the percentiles of the calls' latencies.
func BenchmarkAllocate(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, mon, dir, kubelet := simRig(b, ctx, 0)
	plugin := New(Config{Monitor: mon, Dir: dir, Simulated: true, Poll: 100 * time.Millisecond})
	go plugin.Run(ctx)
	reg := kubelet.waitRegistration(b)
	client := dialPlugin(b, filepath.Join(dir, reg.Endpoint))
	var ids []string
	for _, d := range plugin.Devices() {
		ids = append(ids, d.UUID)
	}
	if len(ids) != 8 {
		b.Fatalf("the plugin has %d GPUs, want 8", len(ids))
	}
	var lat []time.Duration
	i := 0
	for b.Loop() {
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[i%8], ids[(i+1)%8]}}}}
		i++
		t0 := time.Now()
		resp, err := client.Allocate(ctx, req)
		lat = append(lat, time.Since(t0))
		if err != nil || len(resp.ContainerResponses[0].CdiDevices) != 2 {
			b.Fatalf("Allocate: %v %v", resp, err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)*99/100, len(lat)-1)].Nanoseconds()), "p99-ns")
}

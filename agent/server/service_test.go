package server

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	gpunvml "github.com/gpurack/gpurack/agent/gpu/nvml"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

func TestParseFaultSpec(t *testing.T) {
	i := func(v int32) *int32 { return &v }
	ok := []struct {
		in   *agentv1.FaultSpec
		want sim.Fault
		d    time.Duration
	}{
		{&agentv1.FaultSpec{Spec: "xid:79@gpu3"}, sim.Fault{Kind: sim.KindXID, GPU: 3, Value: 79}, 0},
		{&agentv1.FaultSpec{Kind: agentv1.FaultKind_FAULT_KIND_PCIE_LINK_WIDTH, GpuIndex: i(1), Value: 8}, sim.Fault{Kind: sim.KindPCIeWidth, GPU: 1, Value: 8}, 0},
		{&agentv1.FaultSpec{Kind: agentv1.FaultKind_FAULT_KIND_DRIVER_UNLOADED}, sim.Fault{Kind: sim.KindDriverUnloaded, GPU: -1}, 0},
		{&agentv1.FaultSpec{Spec: "gpu-lost@gpu7", Kind: agentv1.FaultKind_FAULT_KIND_GPU_LOST, GpuIndex: i(7), Duration: durationpb.New(time.Minute)},
			sim.Fault{Kind: sim.KindGPULost, GPU: 7}, time.Minute},
		{&agentv1.FaultSpec{Spec: "power-brake@gpu2"}, sim.Fault{Kind: sim.KindPowerBrake, GPU: 2}, 0},
	}
	for _, c := range ok {
		f, d, err := parseFaultSpec(c.in)
		if err != nil || f != c.want || d != c.d {
			t.Errorf("parseFaultSpec(%v) = %+v, %v, %v; want %+v", c.in, f, d, err, c.want)
		}
		back := faultSpec(f, d)
		if back.Spec != f.String() || (f.Kind <= sim.KindDriverUnloaded && back.Kind != agentv1.FaultKind(f.Kind)) {
			t.Errorf("faultSpec(%+v) = %v", f, back)
		}
	}
	for _, bad := range []*agentv1.FaultSpec{
		nil, {}, {Spec: "xid@gpu1"},
		{Kind: agentv1.FaultKind_FAULT_KIND_XID, Value: 79},                                      // no GPU
		{Kind: agentv1.FaultKind_FAULT_KIND_DRIVER_UNLOADED, GpuIndex: i(0)},                     // node-level with GPU
		{Kind: agentv1.FaultKind_FAULT_KIND_GPU_LOST, GpuIndex: i(1), Value: 3},                  // value on a kind without one
		{Spec: "xid:79@gpu3", Kind: agentv1.FaultKind_FAULT_KIND_XID, GpuIndex: i(2), Value: 79}, // disagree
		{Spec: "xid:79@gpu3", Duration: durationpb.New(-time.Second)},
	} {
		if _, _, err := parseFaultSpec(bad); err == nil {
			t.Errorf("parseFaultSpec(%v) accepted", bad)
		}
	}
}

func TestFaultsNeedSimulator(t *testing.T) {
	b := gpunvml.Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	p := &profile.Profile{Name: "x", GPU: &profile.GPU{}}
	svc := &Service{Monitor: monitor.New(monitor.Config{Backend: b, Profile: p})}
	_, err := svc.InjectFault(context.Background(), &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu0"}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("InjectFault on nvml: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := svc.ClearFaults(context.Background(), &agentv1.ClearFaultsRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ClearFaults on nvml: %v", err)
	}
	if _, err := svc.ListGPUs(context.Background(), &agentv1.ListGPUsRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListGPUs without NVML: %v, want UNAVAILABLE", err)
	}
	if _, err := svc.RunChecks(context.Background(), &agentv1.RunChecksRequest{CheckIds: []string{"gpu.nope"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unknown check id: %v", err)
	}
	st, err := svc.Status(context.Background(), &agentv1.StatusRequest{})
	if err != nil || st.Backend != "nvml" || st.Simulated || len(st.ActiveFaults) != 0 {
		t.Errorf("status %v %v", st, err)
	}
}

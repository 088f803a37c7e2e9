package enroll

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// TestHeartbeatKeepsGPUAllocation: the GPU allocation a heartbeat reports is kept as
// the machine's latest; a heartbeat without one leaves it; an empty one clears it; one
// over the bounds is refused with the bound named and changes nothing.
func TestHeartbeatKeepsGPUAllocation(t *testing.T) {
	e := newEnv(t, nil)
	a, mtls, node := joined(e, "52:54:00:00:00:91")
	hb := func(alloc *machinev1.GPUAllocation) error {
		_, err := mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, NodeName: node,
			Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY}, GpuAllocation: alloc})
		return err
	}
	kept := func() *machinev1.GPUAllocation {
		m := e.machine("52:54:00:00:00:91")
		if m.GPUAllocationAt.IsZero() {
			return nil
		}
		got := new(machinev1.GPUAllocation)
		if err := proto.Unmarshal(m.GPUAllocation, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	alloc := &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{
		{GpuUuid: "GPU-1", Namespace: "vision", Pod: "train", Container: "main", Tenant: "alpha"}}}
	if err := hb(alloc); err != nil {
		t.Fatal(err)
	}
	if got := kept(); !proto.Equal(got, alloc) {
		t.Fatalf("kept %v, want %v", got, alloc)
	}
	if err := hb(nil); err != nil {
		t.Fatal(err)
	}
	if got := kept(); !proto.Equal(got, alloc) {
		t.Fatalf("a heartbeat without an allocation changed it to %v", got)
	}

	big := &machinev1.GPUAllocation{}
	for range MaxAllocationHolders + 1 {
		big.Holders = append(big.Holders, &machinev1.GPUHolder{GpuUuid: "G"})
	}
	wantLimit(t, "4097 holders", hb(big), "MaxAllocationHolders")
	huge := &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{{Pod: strings.Repeat("p", MaxAllocationBytes)}}}
	wantLimit(t, "a 128 KiB allocation", hb(huge), "MaxAllocationBytes")
	if got := kept(); !proto.Equal(got, alloc) {
		t.Fatalf("a refused heartbeat changed the allocation to %v", got)
	}

	if err := hb(&machinev1.GPUAllocation{}); err != nil {
		t.Fatal(err)
	}
	if got := kept(); got == nil || len(got.GetHolders()) != 0 {
		t.Fatalf("after an empty allocation: %v, want none held", got)
	}
}

package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// TestServeRateLimitsEnrollment runs the real gpuboot on loopback: Register and
// Heartbeat from one source beyond enrollment.sourceBurst get ResourceExhausted naming
// the setting.
func TestServeRateLimitsEnrollment(t *testing.T) {
	in := newInstance(t, "enrollment: {sourceRate: 0.001, sourceBurst: 3}\n")
	in.start()
	c := in.enrollClient()
	a := newTestAgent(1)
	for i := range 3 {
		if _, err := a.register(context.Background(), c); err != nil {
			t.Fatalf("register %d of the burst of 3: %v", i+1, err)
		}
	}
	_, err := a.register(context.Background(), c)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "enrollment.sourceRate") {
		t.Fatalf("4th register from one source: %v, want ResourceExhausted naming enrollment.sourceRate", err)
	}
	hb := &bootv1.HeartbeatRequest{Identity: a.facts.Identity}
	_, err = c.Heartbeat(context.Background(), hb)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("heartbeat after the burst: %v, want ResourceExhausted", err)
	}
}

// TestServeMessageBound: a message larger than gpuboot decodes (enroll.MaxMessageBytes)
// is refused by gRPC before decoding, with ResourceExhausted "larger than max".
func TestServeMessageBound(t *testing.T) {
	big := newInstance(t, "")
	big.start()
	b := newTestAgent(2)
	b.facts.Gpus = nil
	for range 40 {
		b.facts.Gpus = append(b.facts.Gpus, &machinev1.GPU{ProductName: strings.Repeat("x", 16<<10)})
	}
	_, err := b.register(context.Background(), big.enrollClient())
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Fatalf("register of 640 KiB: %v, want ResourceExhausted from gRPC's receive bound", err)
	}
}

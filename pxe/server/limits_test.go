package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/internal/pki"

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

// enrollClientFrom dials the instance from the loopback address src (127.0.0.0/8 is
// all local on Linux), so that gpuboot sees another source than 127.0.0.1.
func (in *instance) enrollClientFrom(src string) bootv1.EnrollmentServiceClient {
	in.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient(in.tlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfigPinned(in.pin))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		in.t.Fatal(err)
	}
	in.t.Cleanup(func() { conn.Close() })
	return bootv1.NewEnrollmentServiceClient(conn)
}

// TestServeRateLimitsBundleAndReport: GetJoinBundle and ReportCommissioning are rate
// limited per source like Register (issue 33): a burst of made-up tokens from one
// source, and then of unsigned reports from another, get ResourceExhausted naming the
// setting, while a machine calling from a third source registers, is approved and
// fetches its bundle within its own burst.
func TestServeRateLimitsBundleAndReport(t *testing.T) {
	in := newInstance(t, "enrollment: {sourceRate: 0.001, sourceBurst: 3}\n")
	in.start()
	ctx := context.Background()

	guesser := in.enrollClientFrom("127.0.0.1")
	for i := range 4 {
		tok := make([]byte, 24)
		rand.Read(tok)
		_, err := guesser.GetJoinBundle(ctx, &bootv1.GetJoinBundleRequest{Token: "m-guess." + hex.EncodeToString(tok)})
		switch code := status.Code(err); {
		case i < 3 && (code == codes.ResourceExhausted || code == codes.OK):
			t.Fatalf("GetJoinBundle %d of the burst of 3 with a made-up token: %v, want a refusal that is not the rate limit", i+1, err)
		case i == 3 && (code != codes.ResourceExhausted || !strings.Contains(err.Error(), "enrollment.sourceRate")):
			t.Fatalf("4th GetJoinBundle from one source: %v, want ResourceExhausted naming enrollment.sourceRate", err)
		}
	}
	reporter := in.enrollClientFrom("127.0.0.3")
	a := newTestAgent(30)
	for i := range 4 {
		_, err := reporter.ReportCommissioning(ctx, &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{Identity: a.facts.Identity}})
		switch code := status.Code(err); {
		case i < 3 && (code == codes.ResourceExhausted || code == codes.OK):
			t.Fatalf("ReportCommissioning %d of the burst of 3, unsigned: %v, want a refusal that is not the rate limit", i+1, err)
		case i == 3 && (code != codes.ResourceExhausted || !strings.Contains(err.Error(), "enrollment.sourceRate")):
			t.Fatalf("4th ReportCommissioning from one source: %v, want ResourceExhausted naming enrollment.sourceRate", err)
		}
	}

	// A machine on another source: Register, Register after approval, GetJoinBundle.
	c := in.enrollClientFrom("127.0.0.2")
	m := newTestAgent(31)
	if _, err := m.register(ctx, c); err != nil {
		t.Fatalf("register from another source: %v", err)
	}
	in.cli("machines", "approve", m.facts.Identity.BootMac, "--reason", "rate limit test")
	r, err := m.register(ctx, c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		t.Fatalf("register after approval from another source: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(m.key, r.Challenge, r.Token)}
	if err := bootv1.SignRequest(m.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetJoinBundle(ctx, req); err != nil {
		t.Fatalf("GetJoinBundle of the approved machine from another source during the flood: %v", err)
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

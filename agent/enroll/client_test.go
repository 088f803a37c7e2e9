package enroll

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gpurack/gpurack/agent/joinbundle"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// scriptedGpuboot answers Register from a script and verifies every signature the
// way gpuboot does (bootv1.VerifyRequest, VerifyJoinBundle). The real gpuboot is in
// the end-to-end test in agent/cmd/gpuagent.
type scriptedGpuboot struct {
	bootv1.UnimplementedEnrollmentServiceServer
	mu        sync.Mutex
	script    []bootv1.RegisterStatus
	registers int
	reports   []*machinev1.Checklist
	challenge []byte
	key       ed25519.PublicKey
	ca        *pki.CA
	// heartbeats records, per Heartbeat, whether it was signed and whether it came
	// with a client certificate.
	heartbeats []heartbeatAuth
}

type heartbeatAuth struct{ signed, cert bool }

func (s *scriptedGpuboot) Heartbeat(ctx context.Context, req *bootv1.HeartbeatRequest) (*bootv1.HeartbeatResponse, error) {
	a := heartbeatAuth{signed: req.GetAuth() != nil}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			a.cert = len(ti.State.PeerCertificates) > 0
		}
	}
	if a.signed {
		if _, err := bootv1.VerifyRequest(bootv1.EnrollmentService_Heartbeat_FullMethodName, req, time.Now()); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
	} else if !a.cert {
		return nil, status.Error(codes.Unauthenticated, "neither signed nor a client certificate")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.heartbeats = append(s.heartbeats, a)
	return &bootv1.HeartbeatResponse{MachineState: bootv1.MachineState_MACHINE_STATE_READY}, nil
}

func (s *scriptedGpuboot) Register(_ context.Context, req *bootv1.RegisterRequest) (*bootv1.RegisterResponse, error) {
	pub, err := bootv1.VerifyRequest(bootv1.EnrollmentService_Register_FullMethodName, req, time.Now())
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if !bytes.Equal(pub, req.GetPublicKey()) || req.GetFacts().GetIdentity().GetBootMac() == "" {
		return nil, status.Error(codes.InvalidArgument, "key or facts")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = pub
	st := s.script[min(s.registers, len(s.script)-1)]
	s.registers++
	r := &bootv1.RegisterResponse{Status: st, MachineState: bootv1.MachineState_MACHINE_STATE_REGISTERED, RetryAfter: durationpb.New(10 * time.Millisecond)}
	if st == bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		r.Token, r.Challenge, r.MachineState = "abcdef.0123456789abcdef", s.challenge, bootv1.MachineState_MACHINE_STATE_APPROVED
	}
	return r, nil
}

func (s *scriptedGpuboot) GetJoinBundle(_ context.Context, req *bootv1.GetJoinBundleRequest) (*bootv1.GetJoinBundleResponse, error) {
	if _, err := bootv1.VerifyRequest(bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now()); err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := bootv1.VerifyJoinBundle(s.key, s.challenge, req.GetToken(), req.GetSignature()); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	return &bootv1.GetJoinBundleResponse{Bundle: &bootv1.JoinBundle{NodeName: "gpu-r1-u01", AgentKeyRef: bootv1.KeyFingerprint(s.key)}}, nil
}

func (s *scriptedGpuboot) ReportCommissioning(_ context.Context, req *bootv1.ReportCommissioningRequest) (*bootv1.ReportCommissioningResponse, error) {
	if _, err := bootv1.VerifyRequest(bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, time.Now()); err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, req.GetReport())
	return &bootv1.ReportCommissioningResponse{MachineState: bootv1.MachineState_MACHINE_STATE_REGISTERED}, nil
}

// serve runs s on loopback with a gpurack CA server certificate and returns the target.
func serve(t *testing.T, s *scriptedGpuboot) Target {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.IssueServer(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	s.ca = ca
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp.TLSCertificate(ca.Cert)},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: ca.CertPool()})))
	bootv1.RegisterEnrollmentServiceServer(gs, s)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return Target{Endpoint: l.Addr().String(), Pin: ca.Pin()}
}

func newClient(t *testing.T, target Target, states *[]agentv1.EnrollmentState) *Client {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	c := &Client{Target: target, Key: key, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Facts: &machinev1.MachineFacts{Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:00:00:01"}},
		PreApproval: func() *machinev1.Checklist {
			return &machinev1.Checklist{Phase: machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL}
		},
		Progress: func(s agentv1.EnrollmentState, _, _ string) {
			if n := len(*states); n == 0 || (*states)[n-1] != s {
				*states = append(*states, s)
			}
		}}
	if err := c.Dial(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEnrollPendingThenApproved: PENDING twice, then APPROVED; the bundle comes back
// for a signature over the challenge; the pre-approval checklist is sent once.
func TestEnrollPendingThenApproved(t *testing.T) {
	s := &scriptedGpuboot{challenge: bytes.Repeat([]byte{7}, bootv1.ChallengeSize), script: []bootv1.RegisterStatus{
		bootv1.RegisterStatus_REGISTER_STATUS_PENDING, bootv1.RegisterStatus_REGISTER_STATUS_PENDING, bootv1.RegisterStatus_REGISTER_STATUS_APPROVED}}
	var states []agentv1.EnrollmentState
	c := newClient(t, serve(t, s), &states)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Enroll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.GetNodeName() != "gpu-r1-u01" || b.GetAgentKeyRef() != bootv1.KeyFingerprint(c.Key.Public().(ed25519.PublicKey)) {
		t.Errorf("bundle %v", b)
	}
	want := []agentv1.EnrollmentState{agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING, agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL, agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED}
	if len(states) != len(want) || states[0] != want[0] || states[1] != want[1] || states[2] != want[2] {
		t.Errorf("states %v, want %v", states, want)
	}
	if s.registers != 3 || len(s.reports) != 1 || s.reports[0].GetPhase() != machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL {
		t.Errorf("registers %d, reports %v", s.registers, s.reports)
	}
}

// TestEnrollRejected: REJECTED ends enrollment with ErrStopped and the state says so.
func TestEnrollRejected(t *testing.T) {
	s := &scriptedGpuboot{script: []bootv1.RegisterStatus{bootv1.RegisterStatus_REGISTER_STATUS_REJECTED}}
	var states []agentv1.EnrollmentState
	c := newClient(t, serve(t, s), &states)
	_, err := c.Enroll(context.Background())
	if !errors.Is(err, ErrStopped) || states[len(states)-1] != agentv1.EnrollmentState_ENROLLMENT_STATE_REJECTED {
		t.Fatalf("err %v, states %v", err, states)
	}
}

// TestEnrollWrongPin: a gpuboot whose CA is not the pinned one is never trusted; the
// agent keeps retrying (and says why) until its context ends.
func TestEnrollWrongPin(t *testing.T) {
	s := &scriptedGpuboot{script: []bootv1.RegisterStatus{bootv1.RegisterStatus_REGISTER_STATUS_PENDING}}
	target := serve(t, s)
	target.Pin = "sha256:" + string(bytes.Repeat([]byte("ab"), 32))
	var states []agentv1.EnrollmentState
	c := newClient(t, target, &states)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Enroll(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	if s.registers != 0 || len(states) != 1 || states[0] != agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING {
		t.Fatalf("registers %d, states %v", s.registers, states)
	}
}

// TestHeartbeatsOverMutualTLSAreNotSigned: before the agent certificate a heartbeat is
// signed with the enrollment key; once the client uses the certificate it leaves
// RequestAuth out (the contract), so that gpuboot authenticates it by the certificate
// and gives it what it gives only over mutual TLS (key rings, revocations, wipes).
// Signing both ways had gpuboot take the signature and never answer with those.
func TestHeartbeatsOverMutualTLSAreNotSigned(t *testing.T) {
	s := &scriptedGpuboot{script: []bootv1.RegisterStatus{bootv1.RegisterStatus_REGISTER_STATUS_PENDING}}
	var states []agentv1.EnrollmentState
	c := newClient(t, serve(t, s), &states)
	ctx := context.Background()
	if _, err := c.Heartbeat(ctx, HeartbeatFields{}); err != nil {
		t.Fatal(err)
	}
	cert, err := pki.CertifyAgent(s.ca, "gpu-r1-u01", nil, c.Key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UseCertificate(&joinbundle.Credentials{Cert: cert, Key: c.Key, CA: s.ca.Cert}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heartbeat(ctx, HeartbeatFields{}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := []heartbeatAuth{{signed: true, cert: false}, {signed: false, cert: true}}
	if len(s.heartbeats) != 2 || s.heartbeats[0] != want[0] || s.heartbeats[1] != want[1] {
		t.Errorf("heartbeats %+v, want %+v", s.heartbeats, want)
	}
}

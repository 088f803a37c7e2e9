package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/joinbundle"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// mtlsNode runs a simulated node with a JoinBundle: its API on a loopback port over
// mutual TLS with the bundle's agent certificate, as `gpuagent run --join-bundle`.
type mtlsNode struct {
	n    *node
	addr string
	ca   *pki.CA
}

func startMTLSNode(t *testing.T) *mtlsNode {
	t.Helper()
	cfg := simConfig(t)
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.IssueAgent(ca, "node-a", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(cfg.KeyDir, "agent-test.key")
	if err := pki.SaveKeyPair(filepath.Join(cfg.KeyDir, "agent-test.pem"), keyFile, agent); err != nil {
		t.Fatal(err)
	}
	bundle := &bootv1.JoinBundle{NodeName: "node-a", AgentCertificatePem: string(pki.EncodeCertPEM(agent.Cert)), AgentKeyRef: "file:" + keyFile,
		GpurackCaPem: string(pki.EncodeCertPEM(ca.Cert)), IssuedAt: timestamppb.Now()}
	creds, err := joinbundle.LoadCredentials(bundle, cfg.KeyDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bundle, cfg.Credentials, cfg.Listen = bundle, creds, freeLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	n, err := newNode(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); n.services.Wait() })
	return &mtlsNode{n: n, addr: cfg.Listen, ca: ca}
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// operator issues an operator certificate at level.
func (m *mtlsNode) operator(t *testing.T, name string, level pki.OperatorLevel) *pki.KeyPair {
	t.Helper()
	kp, err := pki.IssueOperatorLevel(m.ca, name, level)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// client is one gRPC connection to the node's API presenting kp, opened and Ready.
func (m *mtlsNode) client(t *testing.T, kp *pki.KeyPair) (*grpc.ClientConn, agentv1.AgentServiceClient) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(m.ca.Cert)
	conn, err := grpc.NewClient("passthrough:///"+m.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: "node-a", Certificates: []tls.Certificate{kp.TLSCertificate()}})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, agentv1.NewAgentServiceClient(conn)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitServing waits until the node's API answers an admin over mutual TLS.
func (m *mtlsNode) waitServing(t *testing.T) {
	t.Helper()
	_, c := m.client(t, m.operator(t, "probe", pki.LevelAdmin))
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Status(ctx, &agentv1.StatusRequest{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's mTLS API never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wantRefused checks that err is code and that its message says says.
func wantRefused(t *testing.T, what string, err error, code codes.Code, says string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), says) {
		t.Errorf("%s: %v; want %v saying %q", what, err, code, says)
	}
}

// TestMTLSRevocationOnOpenConnection: an operator's connection, opened and used before
// gpuboot revokes the operator, is refused on its next call once the heartbeat answer
// brings the new list (useRevocations, what the join loop calls): the refusal comes
// from the per-call check (Unauthenticated "certificate revoked") on the same, still
// Ready connection, not from a new handshake.
func TestMTLSRevocationOnOpenConnection(t *testing.T) {
	m := startMTLSNode(t)
	m.waitServing(t)
	alice := m.operator(t, "alice", pki.LevelAdmin)
	conn, c := m.client(t, alice)
	ctx := callCtx(t)
	if _, err := c.Status(ctx, &agentv1.StatusRequest{}); err != nil {
		t.Fatalf("alice before the revocation: %v", err)
	}
	if _, err := c.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}}); err != nil {
		t.Fatalf("alice (admin) injects before the revocation: %v", err)
	}
	m.n.useRevocations(&bootv1.Revocations{Serials: []string{alice.Cert.SerialNumber.Text(16)}})
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"Status", func() error { _, err := c.Status(ctx, &agentv1.StatusRequest{}); return err }},
		{"ClearFaults", func() error { _, err := c.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); return err }},
		{"WatchEvents", func() error {
			w, err := c.WatchEvents(ctx, &agentv1.WatchEventsRequest{})
			if err != nil {
				return err
			}
			_, err = w.Recv()
			return err
		}},
	} {
		wantRefused(t, "revoked alice's "+call.name+" on her open connection", call.do(), codes.Unauthenticated, "certificate revoked")
	}
	if s := conn.GetState(); s != connectivity.Ready {
		t.Errorf("alice's connection is %v: the refusals should have come on the open connection", s)
	}
	// Another operator is not affected.
	_, other := m.client(t, m.operator(t, "carol", pki.LevelAdmin))
	if _, err := other.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Errorf("carol after alice's revocation: %v", err)
	}
}

// TestMTLSRevocationEndsOpenStreams: a WatchEvents stream opened before the revocation
// ends with Unauthenticated "certificate revoked" when the heartbeat answer brings the
// list that revokes its peer; another operator's stream stays open and still gets
// events.
func TestMTLSRevocationEndsOpenStreams(t *testing.T) {
	m := startMTLSNode(t)
	m.waitServing(t)
	ctx := callCtx(t)
	bobKP := m.operator(t, "bob", pki.LevelViewer)
	_, bob := m.client(t, bobKP)
	_, dave := m.client(t, m.operator(t, "dave", pki.LevelViewer))
	_, admin := m.client(t, m.operator(t, "root", pki.LevelAdmin))
	bobWatch, err := bob.WatchEvents(ctx, &agentv1.WatchEventsRequest{Kinds: []agentv1.EventKind{agentv1.EventKind_EVENT_KIND_XID}})
	if err != nil {
		t.Fatal(err)
	}
	daveWatch, err := dave.WatchEvents(ctx, &agentv1.WatchEventsRequest{Kinds: []agentv1.EventKind{agentv1.EventKind_EVENT_KIND_XID}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both streams open at the agent", func() bool { return m.n.guard.Streams() == 2 })

	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := bobWatch.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	m.n.useRevocations(&bootv1.Revocations{Serials: []string{bobKP.Cert.SerialNumber.Text(16)}})
	select {
	case err := <-ended:
		wantRefused(t, "bob's stream after his revocation", err, codes.Unauthenticated, "certificate revoked")
	case <-time.After(10 * time.Second):
		t.Fatal("bob's WatchEvents stream, opened before his revocation, was still open 10 s after it")
	}
	if got := m.n.guard.Streams(); got != 1 {
		t.Errorf("%d streams open after the revocation, want dave's alone", got)
	}
	if _, err := admin.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu2"}}); err != nil {
		t.Fatal(err)
	}
	ev, err := daveWatch.Recv()
	if err != nil || ev.GetXid().GetXid() != 79 {
		t.Errorf("dave's stream after bob's revocation: %v %v", ev, err)
	}
}

// TestMTLSOperatorLevels: each method needs its level (CONTRACTS §4): a viewer reads
// but may neither run checks nor inject faults, an operator runs checks but may not
// inject, an admin injects; the refusal names the level and how to get it. Another
// node's agent certificate, from the same CA, is refused at the handshake.
func TestMTLSOperatorLevels(t *testing.T) {
	m := startMTLSNode(t)
	m.waitServing(t)
	ctx := callCtx(t)
	inject := func(c agentv1.AgentServiceClient) error {
		_, err := c.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu1"}})
		return err
	}
	runChecks := func(c agentv1.AgentServiceClient) error {
		_, err := c.RunChecks(ctx, &agentv1.RunChecksRequest{})
		return err
	}

	viewerConn, viewer := m.client(t, m.operator(t, "vera", pki.LevelViewer))
	if _, err := viewer.Status(ctx, &agentv1.StatusRequest{}); err != nil {
		t.Errorf("viewer Status: %v", err)
	}
	// grpcurl's way in: health and server reflection are a viewer's.
	if h, err := healthpb.NewHealthClient(viewerConn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("viewer health Check: %v %v", h, err)
	}
	refl, err := reflectionpb.NewServerReflectionClient(viewerConn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if r, err := refl.Recv(); err != nil || !strings.Contains(r.String(), "gpurack.agent.v1.AgentService") {
		t.Errorf("viewer reflection ListServices: %v %v", r, err)
	}
	refl.CloseSend()
	if _, err := viewer.ListGPUs(ctx, &agentv1.ListGPUsRequest{}); err != nil {
		t.Errorf("viewer ListGPUs: %v", err)
	}
	wantRefused(t, "viewer RunChecks", runChecks(viewer), codes.PermissionDenied, "needs operator level operator")
	wantRefused(t, "viewer InjectFault", inject(viewer), codes.PermissionDenied, "gpuboot certs operator NAME --level admin")
	_, err = viewer.ClearFaults(ctx, &agentv1.ClearFaultsRequest{})
	wantRefused(t, "viewer ClearFaults", err, codes.PermissionDenied, "needs operator level admin")

	_, operator := m.client(t, m.operator(t, "otto", pki.LevelOperator))
	if err := runChecks(operator); err != nil {
		t.Errorf("operator RunChecks: %v", err)
	}
	wantRefused(t, "operator InjectFault", inject(operator), codes.PermissionDenied, "needs operator level admin")

	_, admin := m.client(t, m.operator(t, "ada", pki.LevelAdmin))
	if err := inject(admin); err != nil {
		t.Errorf("admin InjectFault: %v", err)
	}
	if _, err := admin.ClearFaults(ctx, &agentv1.ClearFaultsRequest{}); err != nil {
		t.Errorf("admin ClearFaults: %v", err)
	}

	other, err := pki.IssueAgent(m.ca, "node-b", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	_, nodeB := m.client(t, other)
	if _, err := nodeB.Status(ctx, &agentv1.StatusRequest{}); err == nil {
		t.Error("another node's agent certificate was served")
	} else if err := inject(nodeB); err == nil {
		t.Error("another node's agent certificate injected a fault")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

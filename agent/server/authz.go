package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// methodLevels is the operator level each method on the agent's mutual-TLS port needs
// (pki.OperatorLevel, CONTRACTS §4). A method not listed here is refused: a method added
// to the API is nobody's until it is given a level here.
var methodLevels = map[string]pki.OperatorLevel{
	agentv1.AgentService_Status_FullMethodName:      pki.LevelViewer,
	agentv1.AgentService_ListGPUs_FullMethodName:    pki.LevelViewer,
	agentv1.AgentService_WatchEvents_FullMethodName: pki.LevelViewer,
	agentv1.AgentService_RunChecks_FullMethodName:   pki.LevelOperator,
	agentv1.AgentService_InjectFault_FullMethodName: pki.LevelAdmin,
	agentv1.AgentService_ClearFaults_FullMethodName: pki.LevelAdmin,

	healthpb.Health_Check_FullMethodName: pki.LevelViewer,
	healthpb.Health_List_FullMethodName:  pki.LevelViewer,
	healthpb.Health_Watch_FullMethodName: pki.LevelViewer,

	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      pki.LevelViewer,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: pki.LevelViewer,
}

// authorize decides whether the peer presenting certs (leaf first, as TLS gives them)
// may call method at now: its certificates are not on revoked (nil: none revoked) and
// have not expired since the handshake, the leaf's role is the operators', and its
// operator level is at least the method's. The error is a gRPC status saying what the
// caller can do about it.
func authorize(method string, certs []*x509.Certificate, revoked *pki.RevocationList, now time.Time) error {
	if len(certs) == 0 || certs[0] == nil {
		return status.Error(codes.Unauthenticated, "no client certificate: the agent's API takes an operator certificate from gpuboot (gpuboot certs operator NAME)")
	}
	if err := checkRevoked(certs, revoked); err != nil {
		return err
	}
	leaf := certs[0]
	if now.After(leaf.NotAfter) {
		return status.Errorf(codes.Unauthenticated, "certificate %q expired at %s: ask an admin for a new operator certificate (gpuboot certs operator NAME)",
			leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if r := pki.RoleOf(leaf); r != pki.RoleOperators {
		return status.Errorf(codes.PermissionDenied, "certificate %q has role %q, not %s: only operators use the agent's API (gpuboot certs operator NAME)",
			leaf.Subject.CommonName, r, pki.RoleOperators)
	}
	need, ok := methodLevels[method]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s is not a method the agent's TLS port serves to anyone", method)
	}
	have := pki.OperatorLevelOf(leaf)
	if !have.Allows(need) {
		held := have.Name()
		if have == "" {
			held = "no single level (its subject names two)"
		}
		return status.Errorf(codes.PermissionDenied, "%s needs operator level %s; certificate %q has %s: ask an admin for a certificate at that level (gpuboot certs operator NAME --level %s)",
			method, need.Name(), leaf.Subject.CommonName, held, need.Name())
	}
	return nil
}

// checkRevoked is the Unauthenticated refusal of a peer on revoked.
func checkRevoked(certs []*x509.Certificate, revoked *pki.RevocationList) error {
	if revoked == nil {
		return nil
	}
	if err := revoked.Check(certs); err != nil {
		return status.Errorf(codes.Unauthenticated, "certificate revoked: %v; ask an admin for a new operator certificate (gpuboot certs operator NAME)", err)
	}
	return nil
}

// Guard authorises every call on the agent's mutual-TLS port, not only the TLS
// handshake (joinbundle.Credentials.ServerTLS checks the role and the revocation list
// when a connection opens; a connection then lives on). On each call it reads the
// peer's certificate from the connection and checks it against the revocation list as
// it is now and against methodLevels. It remembers the open streams (WatchEvents,
// health Watch, reflection) and Recheck ends those whose peer a new list revokes.
//
// The local unix socket and --insecure TCP have no Guard: they have no peer
// certificate to check (docs/agent.md, "Security").
type Guard struct {
	revoked *pki.RevocationList

	mu      sync.Mutex
	streams map[*guardedStream]struct{}
}

// NewGuard returns a Guard reading revoked (nil: none revoked) on every call; the
// caller changes the list in place (pki.RevocationList.Replace) and then calls Recheck.
func NewGuard(revoked *pki.RevocationList) *Guard {
	return &Guard{revoked: revoked, streams: map[*guardedStream]struct{}{}}
}

// errRevokedMidStream is the cause Recheck cancels a stream's context with.
var errRevokedMidStream = errors.New("peer certificate revoked while the stream was open")

// guardedStream is an open stream: its peer's certificates and how to end it.
type guardedStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelCauseFunc
	certs  []*x509.Certificate
}

func (s *guardedStream) Context() context.Context { return s.ctx }

// ServerOptions are the interceptors that install the Guard on a grpc.Server.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream)}
}

// Recheck ends every open stream whose peer the revocation list now revokes (the
// client sees Unauthenticated "certificate revoked") and returns how many it ended.
func (g *Guard) Recheck() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	ended := 0
	for s := range g.streams {
		if g.revoked != nil && g.revoked.Check(s.certs) != nil {
			s.cancel(errRevokedMidStream)
			delete(g.streams, s)
			ended++
		}
	}
	return ended
}

// Streams returns how many streams are open (for tests and status).
func (g *Guard) Streams() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.streams)
}

func (g *Guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if _, err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *Guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	certs, err := g.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	s := &guardedStream{ServerStream: ss, ctx: ctx, cancel: cancel, certs: certs}
	g.mu.Lock()
	g.streams[s] = struct{}{}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.streams, s)
		g.mu.Unlock()
	}()
	// A list installed between the check and the registration above has had its
	// Recheck already: look once more.
	if err := checkRevoked(certs, g.revoked); err != nil {
		return err
	}
	err = handler(srv, s)
	if errors.Is(context.Cause(ctx), errRevokedMidStream) {
		return checkRevoked(certs, g.revoked)
	}
	return err
}

// check authorises the call on ctx's connection and returns the peer's certificates.
func (g *Guard) check(ctx context.Context, method string) ([]*x509.Certificate, error) {
	certs, err := peerCertificates(ctx)
	if err != nil {
		return nil, err
	}
	return certs, authorize(method, certs, g.revoked, time.Now())
}

// peerCertificates are the certificates the peer of ctx's call presented in its TLS
// handshake, leaf first.
func peerCertificates(ctx context.Context) ([]*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer on the call")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, fmt.Sprintf("the call came without TLS (%T): the agent's TCP port takes mutual TLS", p.AuthInfo))
	}
	return ti.State.PeerCertificates, nil
}

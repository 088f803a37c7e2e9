package server

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
)

// NewGRPC returns a gRPC server with AgentService, grpc.health.v1 (SERVING for "" and
// the service name) and server reflection. With tlsConf (mutual TLS) guard authorises
// every call and must not be nil; tlsConf nil means plaintext, guard nil: the local unix
// socket, or TCP behind --insecure.
func NewGRPC(svc agentv1.AgentServiceServer, tlsConf *tls.Config, guard *Guard) (*grpc.Server, *health.Server) {
	var opts []grpc.ServerOption
	if tlsConf != nil {
		if guard == nil {
			panic("server.NewGRPC: mutual TLS without a Guard would authorise calls at the handshake only")
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConf)))
		opts = append(opts, guard.ServerOptions()...)
	}
	s := grpc.NewServer(opts...)
	agentv1.RegisterAgentServiceServer(s, svc)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(agentv1.AgentService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s, h
}

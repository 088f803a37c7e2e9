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
// the service name) and server reflection. tlsConf nil means plaintext: the local unix
// socket, or TCP behind --insecure.
func NewGRPC(svc agentv1.AgentServiceServer, tlsConf *tls.Config) (*grpc.Server, *health.Server) {
	var opts []grpc.ServerOption
	if tlsConf != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConf)))
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

// Package adminclient connects an operator to gpuboot's AdminService (CONTRACTS §4):
// the operator credentials directory (`gpuboot certs operator NAME --out DIR`) and a
// gRPC connection that checks it reached gpuboot, not another holder of a gpurack
// certificate. The `gpuboot machines`, `rack` and `gossip` commands use it.
//
// It holds no server side and no enrollment logic; pxe/admin serves what it calls.
package adminclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// Files of an operator credentials directory (`gpuboot certs operator NAME --out DIR`).
const (
	CAFile   = "ca.crt"
	CertFile = "operator.crt"
	KeyFile  = "operator.key"
)

// MaxOperatorReplyBytes is the largest answer the operator CLI takes, instead of gRPC's
// 4 MiB: a rack report in JSON carries every machine's whole checklist, about 99 KB a
// machine (9.9 MB for the 100-node simulated rack, make bench-rack), so this covers
// racks of some 2500 machines.
const MaxOperatorReplyBytes = 256 << 20

// DialAdmin connects to AdminService at addr (HOST:PORT) with the operator credentials
// in dir (ca.crt, operator.crt, operator.key). The server certificate must name HOST,
// chain to ca.crt and carry gpuboot's role (CONTRACTS §4): an agent certificate is
// signed by the same CA and serverAuth too, and must not pass for gpuboot.
func DialAdmin(addr, dir string) (bootv1.AdminServiceClient, func() error, error) {
	cfg, err := OperatorTLS(dir)
	if err != nil {
		return nil, nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--server %q: want HOST:PORT", addr)
	}
	cfg.ServerName, cfg.VerifyConnection = host, requireGpubootRole
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxOperatorReplyBytes)))
	if err != nil {
		return nil, nil, err
	}
	return bootv1.NewAdminServiceClient(conn), conn.Close, nil
}

// OperatorTLS is a client TLS configuration with the operator credentials in dir
// (ca.crt, operator.crt, operator.key): the operator certificate, and ca.crt as the
// only root. The caller sets the server name (and any role check) for its server:
// gpuboot (DialAdmin) or a node's agent.
func OperatorTLS(dir string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("operator credentials: %w (issue them with `gpuboot certs operator NAME --out DIR`, then pass --credentials DIR)", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("operator credentials: %s holds no certificate", filepath.Join(dir, CAFile))
	}
	kp, err := pki.LoadKeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("operator credentials: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{kp.TLSCertificate()}}, nil
}

// requireGpubootRole refuses a server whose certificate is not gpuboot's (role
// gpurack:servers), after the usual chain and host name checks passed.
func requireGpubootRole(cs tls.ConnectionState) error {
	if err := pki.PeerHasRole(cs, pki.RoleServers); err != nil {
		return fmt.Errorf("%w: this is not gpuboot (check --server)", err)
	}
	return nil
}

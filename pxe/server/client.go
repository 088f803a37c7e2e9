package server

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

// DialAdmin connects to AdminService at addr (HOST:PORT) with the operator credentials
// in dir (ca.crt, operator.crt, operator.key). The server certificate must name HOST
// and chain to ca.crt.
func DialAdmin(addr, dir string) (bootv1.AdminServiceClient, func() error, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, OperatorCAFile))
	if err != nil {
		return nil, nil, fmt.Errorf("operator credentials: %w (issue them with `gpuboot certs operator NAME --out DIR`, then pass --credentials DIR)", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("operator credentials: %s holds no certificate", filepath.Join(dir, OperatorCAFile))
	}
	kp, err := pki.LoadKeyPair(filepath.Join(dir, OperatorCertFile), filepath.Join(dir, OperatorKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("operator credentials: %w", err)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--server %q: want HOST:PORT", addr)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: host, Certificates: []tls.Certificate{kp.TLSCertificate()}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return nil, nil, err
	}
	return bootv1.NewAdminServiceClient(conn), conn.Close, nil
}

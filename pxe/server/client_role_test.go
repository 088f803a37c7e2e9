package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestDialAdminChecksGpubootRole: the operator CLI's connection refuses a server whose
// certificate chains to the gpurack CA and names the host but is an agent's (issued
// with an IP the machine claimed), and accepts gpuboot's own. Real TLS on loopback.
func TestDialAdminChecksGpubootRole(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	op, err := pki.IssueOperator(ca, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.SaveKeyPair(filepath.Join(dir, OperatorCertFile), filepath.Join(dir, OperatorKeyFile), op); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, OperatorCAFile), pki.EncodeCertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	serve := func(kp *pki.KeyPair) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(ptr(kp.TLSCertificate()))))
		bootv1.RegisterAdminServiceServer(gs, bootv1.UnimplementedAdminServiceServer{})
		go gs.Serve(lis)
		t.Cleanup(gs.Stop)
		return lis.Addr().String()
	}
	call := func(addr string) error {
		c, closeFn, err := DialAdmin(addr, dir)
		if err != nil {
			return err
		}
		defer closeFn()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = c.ListMachines(ctx, &bootv1.ListMachinesRequest{})
		return err
	}
	agent, err := pki.IssueAgent(ca, "gpu-r1-01", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := call(serve(agent)); err == nil || !strings.Contains(err.Error(), "not gpurack:servers") {
		t.Errorf("the CLI against an agent certificate: %v; want a refusal naming gpuboot's role", err)
	}
	srv, err := pki.IssueServer(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := call(serve(srv)); status.Code(err) != codes.Unimplemented {
		t.Errorf("the CLI against gpuboot's certificate: %v; want the call to reach the server (Unimplemented here)", err)
	}
}

func ptr[T any](v T) *T { return &v }

package adminclient

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
// with an IP the machine claimed), and accepts gpuboot's own, from which it takes a
// rack report larger than gRPC's default 4 MiB (the 100-node rack's JSON is 9.9 MB).
// Real TLS on loopback.
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
	if err := pki.SaveKeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile), op); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CAFile), pki.EncodeCertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	serve := func(kp *pki.KeyPair) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(ptr(kp.TLSCertificate()))))
		bootv1.RegisterAdminServiceServer(gs, bigReport{})
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
	addr := serve(srv)
	if err := call(addr); status.Code(err) != codes.Unimplemented {
		t.Errorf("the CLI against gpuboot's certificate: %v; want the call to reach the server (Unimplemented here)", err)
	}
	c, closeFn, err := DialAdmin(addr, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	rep, err := c.RackReport(context.Background(), &bootv1.RackReportRequest{Rack: "r1"})
	if err != nil || len(rep.GetContent()) != bigReportBytes {
		t.Errorf("a %d-byte rack report: %d bytes, %v", bigReportBytes, len(rep.GetContent()), err)
	}
}

// bigReport answers RackReport with bigReportBytes, more than gRPC's default limit.
type bigReport struct {
	bootv1.UnimplementedAdminServiceServer
}

const bigReportBytes = 10 << 20

func (bigReport) RackReport(context.Context, *bootv1.RackReportRequest) (*bootv1.RackReportResponse, error) {
	return &bootv1.RackReportResponse{Content: make([]byte, bigReportBytes)}, nil
}

func ptr[T any](v T) *T { return &v }

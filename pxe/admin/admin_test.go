package admin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/report"
)

// asPeer returns ctx as a gRPC call over TLS with the client certificate cert.
func asPeer(ctx context.Context, cert *x509.Certificate) context.Context {
	return peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}})
}

// overEnrollment is the real enrollment service over a bbolt inventory in t.TempDir,
// with a new gpurack CA, manual approval and one rack r1, checking certificates against
// revoked.
func overEnrollment(t *testing.T, revoked *pki.RevocationList) (*pki.CA, *inventory.BoltStore, *enroll.Service) {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	svc, err := enroll.New(context.Background(), enroll.Config{Store: store, CA: ca, Revocations: revoked, Policy: policy.Policy{Mode: policy.Manual},
		Racks: map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: strings.Repeat("a", 40)}}, DefaultRack: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	return ca, store, svc
}

// TestServerOverEnrollment runs the operator surface over the real enrollment service
// and a bbolt inventory, through the two interfaces it declares.
func TestServerOverEnrollment(t *testing.T) {
	ctx := context.Background()
	revoked := pki.NewRevocationList()
	ca, store, svc := overEnrollment(t, revoked)
	if _, err := New(Config{Lifecycle: svc, CA: ca.Cert, Revoked: svc.Revoked}); err == nil || !strings.Contains(err.Error(), "Inventory") {
		t.Fatalf("New without an Inventory: %v; want an error naming it", err)
	}
	srv, err := New(Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1", "r2"}})
	if err != nil {
		t.Fatal(err)
	}

	op, _ := pki.IssueOperator(ca, "alice")
	agent, _ := pki.IssueAgent(ca, "gpu-r1-u01", nil)
	revokedOp, _ := pki.IssueOperator(ca, "mallory")
	revoked.Revoke(revokedOp.Cert.SerialNumber)
	other, _ := pki.NewCA(pki.CARequest{CommonName: "another CA"})
	foreign, _ := pki.IssueOperator(other, "eve")
	for _, tc := range []struct {
		name string
		cert *x509.Certificate
		code codes.Code
	}{
		{"agent certificate", agent.Cert, codes.PermissionDenied},
		{"revoked operator", revokedOp.Cert, codes.Unauthenticated},
		{"operator of another CA", foreign.Cert, codes.Unauthenticated},
	} {
		if _, err := srv.ListMachines(asPeer(ctx, tc.cert), &bootv1.ListMachinesRequest{}); status.Code(err) != tc.code {
			t.Errorf("%s: %v; want %s", tc.name, err, tc.code)
		}
	}

	id, _ := identity.New("52:54:00:00:00:41", "", "SN41")
	if _, err := svc.DecideBoot(ctx, id, netip.MustParseAddr("192.0.2.41")); err != nil {
		t.Fatal(err)
	}
	alice := asPeer(ctx, op.Cert)
	m, err := srv.Approve(alice, &bootv1.ApproveRequest{Machine: id.MAC, NodeName: "gpu-r1-u01", Reason: "listed"})
	if err != nil {
		t.Fatal(err)
	}
	if m.State != bootv1.MachineState_MACHINE_STATE_APPROVED || m.NodeName != "gpu-r1-u01" {
		t.Fatalf("approve: %s %q", m.State, m.NodeName)
	}
	list, err := srv.ListMachines(alice, &bootv1.ListMachinesRequest{States: []bootv1.MachineState{bootv1.MachineState_MACHINE_STATE_APPROVED}})
	if err != nil || len(list.Machines) != 1 || list.Machines[0].Identity.BootMac != id.MAC {
		t.Fatalf("list approved: %v, %v", list, err)
	}
	got, err := srv.GetMachine(alice, &bootv1.GetMachineRequest{Machine: "gpu-r1-u01"})
	if err != nil || len(got.History) != 2 || got.History[1].Actor != "operator:alice" {
		t.Fatalf("get by node name: %v, %v; want discovered and approved by operator:alice", got, err)
	}
	if _, err := srv.Approve(alice, &bootv1.ApproveRequest{Machine: id.MAC}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("approving an approved machine: %v; want FailedPrecondition", err)
	}
	// The configured racks are known even without machines: a report must name one.
	if _, err := srv.RackReport(alice, &bootv1.RackReportRequest{}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "r2") {
		t.Errorf("report without a rack: %v; want InvalidArgument listing r1 and r2", err)
	}
	// Over REST the HTML report comes with a policy that lets nothing load.
	req := httptest.NewRequest("GET", "/api/v1/racks/r1/report?format=html", nil)
	req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{op.Cert}}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	if h := rec.Header(); rec.Code != 200 || h.Get("Content-Type") != "text/html; charset=utf-8" ||
		!strings.HasPrefix(h.Get("Content-Security-Policy"), "default-src 'none'; style-src 'sha256-") || !strings.Contains(rec.Body.String(), "gpu-r1-u01") {
		t.Errorf("GET report?format=html: %d %v\n%s", rec.Code, h, rec.Body)
	}

	// The tenants' GPU quotas join the report when gpuboot can read them; when it
	// cannot, the report still comes, and says why.
	srv.quotas = func(context.Context) (map[string]report.Quota, error) {
		return map[string]report.Quota{"vision": {Hard: 8, Used: 3}}, nil
	}
	r, err := srv.RackReport(alice, &bootv1.RackReportRequest{Rack: "r1"})
	if err != nil || len(r.GetData().GetTenants()) != 1 || r.GetData().GetTenants()[0].GetGpuQuota() != 8 || !strings.Contains(string(r.GetContent()), "3 / 8") {
		t.Errorf("report with quotas: %v %v", r.GetData().GetTenants(), err)
	}
	srv.quotas = func(context.Context) (map[string]report.Quota, error) { return nil, errors.New("forbidden") }
	if r, err := srv.RackReport(alice, &bootv1.RackReportRequest{Rack: "r1"}); err != nil || r.GetData().GetQuotaError() != "forbidden" {
		t.Errorf("report when quotas cannot be read: %v %v", r.GetData().GetQuotaError(), err)
	}
}

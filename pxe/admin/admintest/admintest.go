// Package admintest runs gpuboot's operator surface for tests outside pxe/admin:
// pxe/admin over the enrollment service and a bbolt inventory, with a fresh gpurack CA,
// on a loopback HTTPS port that asks for client certificates of that CA, as gpuboot's
// TLS port does; machines are registered and approved as an operator would.
package admintest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// Gpuboot is a started operator surface.
type Gpuboot struct {
	// URL is the HTTPS base URL; Dir its state folder (inventory.db, and whatever the
	// test's configure puts there).
	URL, Dir string
	CA       *pki.CA
}

// Start runs it in rack r1 (manual approval), with configure (when not nil) editing
// admin.Config before admin.New, and approves a machine for each of nodes, in order
// (MAC 52:54:00:00:01:NN, serial SNN), by an operator-level certificate. Dir is made
// before configure runs, so it may name files there.
func Start(t testing.TB, configure func(dir string, c *admin.Config), nodes ...string) *Gpuboot {
	t.Helper()
	g := &Gpuboot{Dir: t.TempDir()}
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	g.CA = ca
	store, err := inventory.OpenBolt(filepath.Join(g.Dir, "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	svc, err := enroll.New(context.Background(), enroll.Config{Store: store, CA: ca, Revocations: pki.NewRevocationList(), Policy: policy.Policy{Mode: policy.Manual},
		Racks: map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: strings.Repeat("a", 40)}}, DefaultRack: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := admin.Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1"}}
	if configure != nil {
		configure(g.Dir, &cfg)
	}
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	approve(t, ca, svc, srv, nodes)
	serving, err := pki.IssueServer(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{serving.TLSCertificate()},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: Pool(ca.Cert)}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	g.URL = hs.URL
	return g
}

// Pool is a certificate pool of certs.
func Pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// approve registers a machine per node and approves it with that node name.
func approve(t testing.TB, ca *pki.CA, svc *enroll.Service, srv *admin.Server, nodes []string) {
	t.Helper()
	op, err := pki.IssueOperatorLevel(ca, "olga", pki.LevelOperator)
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{op.Cert}}}})
	for i, node := range nodes {
		id, _ := identity.New(fmt.Sprintf("52:54:00:00:01:%02x", i+1), "", fmt.Sprintf("SN%d", i+1))
		if _, err := svc.DecideBoot(context.Background(), id, netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", i+1))); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Approve(ctx, &bootv1.ApproveRequest{Machine: id.MAC, NodeName: node, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
}

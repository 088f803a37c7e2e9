package server

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestMethodTableCoversTheServer: every method the agent's gRPC server registers has
// a level in methodLevels, so none is refused by accident and the table is the one
// place that says who may call what; and the levels are the ones CONTRACTS §4 gives.
func TestMethodTableCoversTheServer(t *testing.T) {
	gs, _ := NewGRPC(&Service{}, nil, nil)
	for svc, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			if _, ok := methodLevels[full]; !ok {
				t.Errorf("%s is served but has no level in methodLevels: every call would be refused", full)
			}
		}
	}
	for m, want := range map[string]pki.OperatorLevel{
		agentv1.AgentService_Status_FullMethodName: pki.LevelViewer, agentv1.AgentService_ListGPUs_FullMethodName: pki.LevelViewer,
		agentv1.AgentService_WatchEvents_FullMethodName: pki.LevelViewer, agentv1.AgentService_RunChecks_FullMethodName: pki.LevelOperator,
		agentv1.AgentService_InjectFault_FullMethodName: pki.LevelAdmin, agentv1.AgentService_ClearFaults_FullMethodName: pki.LevelAdmin,
	} {
		if methodLevels[m] != want {
			t.Errorf("%s needs %q, want %q", m, methodLevels[m], want)
		}
	}
}

// TestAuthorize is the decision alone: revocation first (Unauthenticated), then the
// role, then the level (PermissionDenied, naming the level and how to get it); an
// unlisted method is refused to everyone.
func TestAuthorize(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	op := func(level pki.OperatorLevel) *x509.Certificate {
		kp, err := pki.IssueOperatorLevel(ca, "op-"+level.Name(), level)
		if err != nil {
			t.Fatal(err)
		}
		return kp.Cert
	}
	viewer, operator, admin := op(pki.LevelViewer), op(pki.LevelOperator), op(pki.LevelAdmin)
	before, err := ca.Issue(pki.CertRequest{CommonName: "old", Organizations: []string{string(pki.RoleOperators)}, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	twoLevels, err := ca.Issue(pki.CertRequest{CommonName: "two", Organizations: []string{string(pki.RoleOperators)},
		OrganizationalUnits: []string{string(pki.LevelViewer), string(pki.LevelAdmin)}, Usages: []pki.Usage{pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.IssueAgent(ca, "node-b", nil)
	if err != nil {
		t.Fatal(err)
	}
	revoked := pki.NewRevocationList(admin.SerialNumber)
	readStatus, runChecks, inject := agentv1.AgentService_Status_FullMethodName, agentv1.AgentService_RunChecks_FullMethodName, agentv1.AgentService_InjectFault_FullMethodName
	for _, tt := range []struct {
		name   string
		method string
		cert   *x509.Certificate
		code   codes.Code
		says   string
	}{
		{"viewer reads", readStatus, viewer, codes.OK, ""},
		{"viewer runs checks", runChecks, viewer, codes.PermissionDenied, "needs operator level operator"},
		{"viewer injects", inject, viewer, codes.PermissionDenied, "gpuboot certs operator NAME --level admin"},
		{"operator runs checks", runChecks, operator, codes.OK, ""},
		{"operator injects", inject, operator, codes.PermissionDenied, "has operator"},
		{"no level: issued before levels, an admin", inject, before.Cert, codes.OK, ""},
		{"two levels: none", readStatus, twoLevels.Cert, codes.PermissionDenied, "two"},
		{"revoked admin", readStatus, admin, codes.Unauthenticated, "certificate revoked"},
		{"another node's agent", readStatus, agent.Cert, codes.PermissionDenied, "gpurack:agents"},
		{"unlisted method", "/gpurack.agent.v1.AgentService/Reboot", before.Cert, codes.PermissionDenied, "not a method"},
		{"no certificate", readStatus, nil, codes.Unauthenticated, "no client certificate"},
	} {
		var certs []*x509.Certificate
		if tt.cert != nil {
			certs = []*x509.Certificate{tt.cert}
		}
		err := authorize(tt.method, certs, revoked, time.Now())
		if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.says) {
			t.Errorf("%s: %v, want %v saying %q", tt.name, err, tt.code, tt.says)
		}
	}
	// An intermediate (or any certificate of the chain) on the list refuses the peer too.
	if err := authorize(readStatus, []*x509.Certificate{viewer, ca.Cert}, pki.NewRevocationList(ca.Cert.SerialNumber), time.Now()); status.Code(err) != codes.Unauthenticated {
		t.Errorf("chain with a revoked CA: %v", err)
	}
	// A connection outlives its certificate: the call after NotAfter is refused.
	if err := authorize(readStatus, []*x509.Certificate{viewer}, nil, viewer.NotAfter.Add(time.Second)); status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(err.Error(), "expired") {
		t.Errorf("a call after the certificate expired: %v", err)
	}
}

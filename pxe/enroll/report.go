package enroll

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/checklist"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// caller is an authenticated agent: its machine and key fingerprint.
type caller struct {
	m        *inventory.Machine
	fp       string
	viaCert  bool
	nodeName string
}

// authenticateAgent authenticates a post-Register call (CONTRACTS §2.6): a RequestAuth
// signature by a key registered for the identity, or else an agent certificate issued
// to that machine and not revoked.
func (s *Service) authenticateAgent(ctx context.Context, method string, req bootv1.AuthenticatedRequest, idp *machinev1.MachineIdentity, now time.Time) (*caller, error) {
	id, err := protoconv.IdentityFromProto(idp)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v", method, err)
	}
	if req.GetAuth() != nil {
		pub, err := bootv1.VerifyRequest(method, req, now)
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		m, err := s.store.Lookup(ctx, id.Key())
		if errors.Is(err, inventory.ErrNotFound) {
			return nil, status.Error(codes.PermissionDenied, "this key is not registered for that identity: call Register first")
		} else if err != nil {
			return nil, status.Errorf(codes.Internal, "%s: %v", method, err)
		}
		fp := bootv1.KeyFingerprint(pub)
		if m.FindKey(fp) < 0 {
			return nil, status.Error(codes.PermissionDenied, "this key is not registered for that identity: call Register first")
		}
		return &caller{m: m, fp: fp}, nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no auth and no client certificate")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "no auth and no client certificate: sign the request or call with the agent certificate")
	}
	cert := ti.State.PeerCertificates[0]
	if err := cert.CheckSignatureFrom(s.cfg.CA.Cert); err != nil {
		return nil, status.Error(codes.Unauthenticated, "client certificate not issued by the gpurack CA")
	}
	if pki.RoleOf(cert) != pki.RoleAgents {
		return nil, status.Errorf(codes.PermissionDenied, "client certificate role %q; EnrollmentService takes agent certificates", pki.RoleOf(cert))
	}
	if s.cfg.Revocations.Contains(cert.SerialNumber) {
		return nil, status.Error(codes.Unauthenticated, "client certificate revoked")
	}
	m, err := s.store.Lookup(ctx, id.Key())
	if err != nil {
		return nil, status.Error(codes.PermissionDenied, "the agent certificate is not for that identity")
	}
	serial := cert.SerialNumber.Text(16)
	ok = false
	for _, sn := range m.AgentCertSerials {
		ok = ok || sn == serial
	}
	if !ok || m.NodeName != cert.Subject.CommonName {
		return nil, status.Error(codes.PermissionDenied, "the agent certificate is not for that identity")
	}
	pub, _ := cert.PublicKey.(ed25519.PublicKey)
	return &caller{m: m, fp: bootv1.KeyFingerprint(pub), viaCert: true, nodeName: cert.Subject.CommonName}, nil
}

// commissioningMove returns the state a COMMISSIONING report moves a machine to and
// the reason. A simulated report (the agent ran the simulator GPU backend) never makes
// a machine ready unless allowSimulated says so (CONTRACTS §11).
func commissioningMove(cl *machinev1.Checklist, allowSimulated bool) (inventory.State, string) {
	if checklist.Overall(cl) == machinev1.CheckStatus_CHECK_STATUS_FAIL {
		return inventory.Quarantined, "commissioning report failed " + strings.Join(checklist.FailingChecks(cl), ", ")
	}
	if cl.GetSimulated() {
		if !allowSimulated {
			return inventory.Quarantined, "commissioning report passed but is simulated: the agent runs the simulator GPU backend, not real GPUs; set enrollment.allowSimulated: true in gpuboot's config to let simulated machines be ready (labs and demos only)"
		}
		return inventory.Ready, "commissioning report passed (simulated GPUs; enrollment.allowSimulated is on)"
	}
	return inventory.Ready, "commissioning report passed"
}

// ReportCommissioning implements EnrollmentService.ReportCommissioning (CONTRACTS
// §2.3, §2.7).
func (s *Service) ReportCommissioning(ctx context.Context, req *bootv1.ReportCommissioningRequest) (*bootv1.ReportCommissioningResponse, error) {
	if err := checkReportLimits(req); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	report := req.GetReport()
	if report == nil {
		return nil, status.Error(codes.InvalidArgument, "report is missing")
	}
	c, err := s.authenticateAgent(ctx, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, report.GetIdentity(), now)
	if err != nil {
		return nil, err
	}
	raw, _ := proto.Marshal(report)
	var msg string
	var notCurrent error
	m, err := s.update(ctx, c.m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State == inventory.Rejected {
			return nil, status.Error(codes.PermissionDenied, errRejected)
		}
		if i := m.FindKey(c.fp); i >= 0 {
			m.Keys[i].LastSeen = now.UTC()
		}
		current := m.BoundKey == c.fp || (m.BoundKey == "" && len(m.Keys) == 1 && m.Keys[0].Fingerprint == c.fp) || c.viaCert
		if !current {
			// The key's liveness is stored; the report is not, and the agent is told
			// so rather than answered as if it were (it would stop resending).
			notCurrent = status.Errorf(codes.FailedPrecondition,
				"report not stored: key %s is not the current key for this identity (another key is bound or live; %s): resend once this key is current or an operator resolved it",
				short(c.fp), keysSummary(m))
			return nil, nil
		}
		if m.State == inventory.Decommissioned {
			return nil, status.Error(codes.PermissionDenied, "machine decommissioned")
		}
		m.Checklist = raw
		phase := report.GetPhase()
		if phase != machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING {
			msg = "stored"
			if phase == machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL {
				msg = "stored for approval"
			}
			return nil, nil
		}
		switch m.State {
		case inventory.Commissioning, inventory.Ready, inventory.Quarantined:
			to, reason := commissioningMove(report, s.cfg.AllowSimulated)
			msg = string(to) + ": " + reason
			if to == m.State {
				return nil, nil
			}
			t, err := inventory.Move(m, to, agentActor(c.fp), reason, now)
			if err != nil {
				return nil, err
			}
			return []inventory.Transition{t}, nil
		case inventory.Joining:
			m.CommissioningReport = raw
			msg = "stored; applied when the Node registers"
		default:
			msg = "stored for the operator; changes no state before the machine joins"
		}
		return nil, nil
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "report: %v", err)
	}
	if notCurrent != nil {
		return nil, notCurrent
	}
	return &bootv1.ReportCommissioningResponse{MachineState: protoconv.StateProto(m.State), Message: msg}, nil
}

// Heartbeat implements EnrollmentService.Heartbeat (CONTRACTS §2.6, §2.8).
func (s *Service) Heartbeat(ctx context.Context, req *bootv1.HeartbeatRequest) (*bootv1.HeartbeatResponse, error) {
	if err := checkHeartbeatLimits(req); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	c, err := s.authenticateAgent(ctx, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, req.GetIdentity(), now)
	if err != nil {
		return nil, err
	}
	if c.m.State == inventory.Decommissioned {
		return nil, status.Error(codes.PermissionDenied, "machine decommissioned")
	}
	if c.m.State == inventory.Rejected {
		return nil, status.Error(codes.PermissionDenied, errRejected)
	}
	health, _ := proto.Marshal(req.GetHealth())
	var allocation []byte
	if a := req.GetGpuAllocation(); a != nil {
		allocation, _ = proto.MarshalOptions{Deterministic: true}.Marshal(a)
	}
	remote := remoteOf(ctx)
	ringChanged := false
	m, err := s.update(ctx, c.m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if m.State == inventory.Decommissioned {
			return nil, status.Error(codes.PermissionDenied, "machine decommissioned")
		}
		if m.State == inventory.Rejected {
			return nil, status.Error(codes.PermissionDenied, errRejected)
		}
		stale := false
		if i := m.FindKey(c.fp); i >= 0 {
			k := &m.Keys[i]
			k.LastSeen, k.Remote = now.UTC(), remote
			// A heartbeat after a boot request for the identity (which ended the
			// key) shows the agent still runs: the key is live again.
			k.Ended = false
			if started := req.GetAgentStartedAt(); started != nil {
				if started.AsTime().Equal(k.HeartbeatStartedAt) && req.GetSequence() <= k.HeartbeatSeq {
					stale = true // a late duplicate of an older heartbeat of this process
				} else {
					k.HeartbeatStartedAt, k.HeartbeatSeq = started.AsTime().UTC(), req.GetSequence()
				}
			}
		}
		if !stale && (m.BoundKey == c.fp || c.viaCert || m.BoundKey == "") {
			if req.GetHealth() != nil {
				m.Health = health
			}
			if req.GetGpuAllocation() != nil && allocationCounts(m, c) {
				m.GPUAllocation, m.GPUAllocationAt = allocation, now.UTC()
			}
			m.LastHeartbeat = now.UTC()
			if c.viaCert {
				ringChanged = m.GossipKeyring != req.GetGossipKeyring()
				m.GossipKeyring = req.GetGossipKeyring()
			}
		}
		t, ok, err := conflictMove(m, now)
		if err != nil {
			return nil, fmt.Errorf("heartbeat: %w", err)
		}
		if ok {
			return []inventory.Transition{t}, nil
		}
		return nil, nil
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "heartbeat: %v", err)
	}
	resp := &bootv1.HeartbeatResponse{MachineState: protoconv.StateProto(m.State), Interval: durationpb.New(DefaultHeartbeatEvery),
		Gossip: s.gossipAnswer(c, m, req.GetGossipKeyring())}
	if c.viaCert && req.GetRevocationsDigest() != s.cfg.Revocations.Digest() {
		resp.Revocations = &bootv1.Revocations{Serials: s.cfg.Revocations.Serials()}
	}
	if c.viaCert && m.Rack != "" {
		s.advanceRing(ctx, m.Rack, ringChanged)
	}
	return resp, nil
}

// allocationCounts says whether c's GPU allocation (which pods hold the machine's GPUs)
// may be stored for m: only a bound machine's that is joining, commissioning or ready,
// sent with the bound key or the machine's agent certificate. A stranger's key, a
// rejected or merely registered machine's, would otherwise put invented tenants into
// the rack report's "GPUs by tenant" (issue 33).
func allocationCounts(m *inventory.Machine, c *caller) bool {
	switch m.State {
	case inventory.Joining, inventory.Commissioning, inventory.Ready:
	default:
		return false
	}
	return c.viaCert || (m.BoundKey != "" && m.BoundKey == c.fp)
}

// errRejected answers a rejected machine's Heartbeat and ReportCommissioning.
const errRejected = "machine rejected by an operator: heartbeats and reports are refused until an operator approves it (gpuboot machines approve)"

// keysSummary names m's bound key and how many keys it holds, for messages.
func keysSummary(m *inventory.Machine) string {
	if m.BoundKey != "" {
		return fmt.Sprintf("bound key %s, %d keys", short(m.BoundKey), len(m.Keys))
	}
	return fmt.Sprintf("no bound key, %d keys", len(m.Keys))
}

func decodeChecklist(b []byte) (*machinev1.Checklist, error) {
	cl := new(machinev1.Checklist)
	return cl, proto.Unmarshal(b, cl)
}

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

// caller is an authenticated agent: its machine, key and key fingerprint.
type caller struct {
	m        *inventory.Machine
	pub      ed25519.PublicKey
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
		return &caller{m: m, pub: pub, fp: fp}, nil
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
	// The handshake checked the validity period once; a connection opened before the
	// certificate expired does not outlive it (the agent renews and reconnects).
	if now.After(cert.NotAfter) {
		return nil, status.Errorf(codes.Unauthenticated, "client certificate expired at %s: renew it (RenewAgentCertificate with auth) and reconnect", cert.NotAfter.UTC().Format(time.RFC3339))
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
	return &caller{m: m, pub: pub, fp: bootv1.KeyFingerprint(pub), viaCert: true, nodeName: cert.Subject.CommonName}, nil
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
	in := readHeartbeat(ctx, req)
	var hb heartbeatOutcome
	m, err := s.update(ctx, c.m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		var ts []inventory.Transition
		var err error
		hb, ts, err = applyHeartbeat(m, c, req, in, now)
		return ts, err
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "heartbeat: %v", err)
	}
	if hb.ignoredWipe != "" {
		s.log.Info("heartbeat: wipe result ignored: it names no wipe pending for the machine", "machine", m.ID, "detail", hb.ignoredWipe)
	}
	resp := &bootv1.HeartbeatResponse{MachineState: protoconv.StateProto(m.State), Interval: durationpb.New(DefaultHeartbeatEvery),
		Gossip: s.gossipAnswer(c, m, req.GetGossipKeyring())}
	if c.viaCert && req.GetRevocationsDigest() != s.cfg.Revocations.Digest() {
		resp.Revocations = &bootv1.Revocations{Serials: s.cfg.Revocations.Serials()}
	}
	if c.viaCert {
		// Only over mutual TLS: the certificate names the machine's node, so the wipe
		// goes to the agent the machine joined with and to nobody else.
		resp.Wipe = protoconv.WipeProto(m.PendingWipe)
	}
	if c.viaCert && m.Rack != "" {
		s.advanceRing(ctx, m.Rack, hb.ringChanged)
	}
	return resp, nil
}

// heartbeatInput is what a heartbeat carries, encoded for the inventory before its
// transaction (deterministically, so an unchanged report writes nothing).
type heartbeatInput struct {
	health, allocation, disks []byte
	remote                    string
}

func readHeartbeat(ctx context.Context, req *bootv1.HeartbeatRequest) heartbeatInput {
	det := proto.MarshalOptions{Deterministic: true}
	in := heartbeatInput{remote: remoteOf(ctx)}
	in.health, _ = proto.Marshal(req.GetHealth())
	if a := req.GetGpuAllocation(); a != nil {
		in.allocation, _ = det.Marshal(a)
	}
	if d := req.GetDataDisks(); d != nil {
		in.disks, _ = det.Marshal(d)
	}
	return in
}

// heartbeatOutcome is what applyHeartbeat found besides the record: whether the
// agent's gossip ring changed, and why a wipe result was ignored ("" when none was).
type heartbeatOutcome struct {
	ringChanged bool
	ignoredWipe string
}

// applyHeartbeat applies c's heartbeat req (encoded as in) to m, in the inventory's
// transaction: the key's liveness, then, unless it is a late duplicate from the
// machine's agent, health, GPU allocation, data disks, gossip ring and the result of a
// pending wipe; and a conflict when two keys are live.
func applyHeartbeat(m *inventory.Machine, c *caller, req *bootv1.HeartbeatRequest, in heartbeatInput, now time.Time) (heartbeatOutcome, []inventory.Transition, error) {
	var out heartbeatOutcome
	if m.State == inventory.Decommissioned {
		return out, nil, status.Error(codes.PermissionDenied, "machine decommissioned")
	}
	if m.State == inventory.Rejected {
		return out, nil, status.Error(codes.PermissionDenied, errRejected)
	}
	stale := touchKey(m, c, req, in.remote, now)
	var ts []inventory.Transition
	if !stale && (m.BoundKey == c.fp || c.viaCert || m.BoundKey == "") {
		if req.GetHealth() != nil {
			m.Health = in.health
		}
		if req.GetGpuAllocation() != nil && allocationCounts(m, c) {
			m.GPUAllocation, m.GPUAllocationAt = in.allocation, now.UTC()
		}
		if req.GetDataDisks() != nil && agentOfRecord(m, c) && m.State.Bound() {
			m.DataDisks, m.DataDisksAt = in.disks, now.UTC()
		}
		m.LastHeartbeat = now.UTC()
		if c.viaCert {
			out.ringChanged = m.GossipKeyring != req.GetGossipKeyring()
			m.GossipKeyring = req.GetGossipKeyring()
		}
		if r := req.GetWipeResult(); r != nil && agentOfRecord(m, c) {
			var err error
			if ts, out.ignoredWipe, err = applyWipeResult(m, c, r, now); err != nil {
				return out, nil, fmt.Errorf("heartbeat: %w", err)
			}
		}
	}
	t, ok, err := conflictMove(m, now)
	if err != nil {
		return out, nil, fmt.Errorf("heartbeat: %w", err)
	}
	if ok {
		ts = append(ts, t)
	}
	return out, ts, nil
}

// touchKey records that c's key called (its liveness, its source address) and the
// heartbeat's place in its agent process's sequence; it reports a late duplicate of an
// older heartbeat of that process (stale), whose contents are ignored.
func touchKey(m *inventory.Machine, c *caller, req *bootv1.HeartbeatRequest, remote string, now time.Time) (stale bool) {
	i := m.FindKey(c.fp)
	if i < 0 {
		return false
	}
	k := &m.Keys[i]
	k.LastSeen, k.Remote = now.UTC(), remote
	// A heartbeat after a boot request for the identity (which ended the key) shows
	// the agent still runs: the key is live again.
	k.Ended = false
	if started := req.GetAgentStartedAt(); started != nil {
		if started.AsTime().Equal(k.HeartbeatStartedAt) && req.GetSequence() <= k.HeartbeatSeq {
			return true
		}
		k.HeartbeatStartedAt, k.HeartbeatSeq = started.AsTime().UTC(), req.GetSequence()
	}
	return false
}

// agentOfRecord reports whether c is m's own agent: it called with the machine's agent
// certificate or its bound key. Only its data disks are kept and only its wipe results
// taken; a registered machine's lone key is not enough (anyone may register one).
func agentOfRecord(m *inventory.Machine, c *caller) bool {
	return c.viaCert || (m.BoundKey != "" && m.BoundKey == c.fp)
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
	return agentOfRecord(m, c)
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

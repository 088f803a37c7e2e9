package enroll

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// renewals remembers when each machine last renewed its agent certificate, so that an
// agent calling in a loop cannot make gpuboot sign certificates (and grow the machine's
// record of serials) without bound. It lives in memory: after a restart of gpuboot the
// first renewal of each machine is always allowed.
type renewals struct {
	mu   sync.Mutex
	last map[string]time.Time // machine id → last renewal
}

// since returns when machine id last renewed ("" time when never).
func (r *renewals) since(id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[id]
}

func (r *renewals) record(id string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	r.last[id] = at
}

// RenewAgentCertificate implements EnrollmentService.RenewAgentCertificate (CONTRACTS
// §2.10): a new agent certificate for the caller's key and node name, valid for
// AgentCertValidity, recorded among the machine's agent certificate serials so that the
// agent can call with it.
func (s *Service) RenewAgentCertificate(ctx context.Context, req *bootv1.RenewAgentCertificateRequest) (*bootv1.RenewAgentCertificateResponse, error) {
	now := s.cfg.Now()
	c, err := s.authenticateAgent(ctx, bootv1.EnrollmentService_RenewAgentCertificate_FullMethodName, req, req.GetIdentity(), now)
	if err != nil {
		return nil, err
	}
	lock := s.machineLock(c.m.ID)
	lock.Lock()
	defer lock.Unlock()
	m, err := s.store.Get(ctx, c.m.ID) // again, under the lock
	if err != nil {
		return nil, status.Errorf(codes.Internal, "renew agent certificate: %v", err)
	}
	if err := checkRenew(m, c.fp, s.renewals.since(m.ID), now, s.cfg.AgentCertValidity); err != nil {
		s.log.Warn("agent certificate renewal refused", "machine", m.ID, "node", m.NodeName, "key", short(c.fp), "remote", remoteOf(ctx), "err", err)
		return nil, err
	}
	cert, err := pki.CertifyAgentFor(s.cfg.CA, m.NodeName, observedIPs(ctx), c.pub, s.cfg.AgentCertValidity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "renew agent certificate: %v", err)
	}
	serial := cert.SerialNumber.Text(16)
	_, err = s.update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if err := checkRenew(m, c.fp, time.Time{}, now, s.cfg.AgentCertValidity); err != nil {
			return nil, err
		}
		m.AgentCertSerials = append(m.AgentCertSerials, serial)
		return nil, nil
	})
	if err != nil {
		s.revoke(serial)
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "renew agent certificate: %v", err)
	}
	s.renewals.record(m.ID, now)
	s.log.Info("agent certificate renewed", "machine", m.ID, "node", m.NodeName, "key", short(c.fp), "serial", serial,
		"not_after", cert.NotAfter.UTC().Format(time.RFC3339), "via", map[bool]string{true: "certificate", false: "key"}[c.viaCert])
	return &bootv1.RenewAgentCertificateResponse{AgentCertificatePem: string(pki.EncodeCertPEM(cert))}, nil
}

// minRenewFraction is the share of the validity that must pass between two renewals of
// one machine; an agent renews at two thirds of it, retrying after a lost answer.
const minRenewFraction = 10

// checkRenew decides whether the holder of key fp may renew m's agent certificate now,
// last being the machine's previous renewal (zero: none known). It is pure; the errors
// are gRPC statuses as enroll.proto documents them.
func checkRenew(m *inventory.Machine, fp string, last, now time.Time, validity time.Duration) error {
	switch {
	case m.State == inventory.Decommissioned:
		return status.Error(codes.PermissionDenied, "machine decommissioned: its agent certificate is not renewed")
	case m.State == inventory.Rejected:
		return status.Error(codes.PermissionDenied, errRejected)
	case m.BoundKey == "" || m.BoundKey != fp:
		return status.Errorf(codes.PermissionDenied, "key %s is not the machine's bound key (%s): only the agent the machine joined with renews its certificate", short(fp), keysSummary(m))
	}
	if i := m.FindKey(fp); i < 0 || !m.Keys[i].BundleReleased || m.NodeName == "" {
		return status.Error(codes.PermissionDenied, "no JoinBundle was released to this key: there is no agent certificate to renew; enroll first")
	}
	if !m.State.Bound() {
		return status.Errorf(codes.FailedPrecondition, "machine is %s: its agent certificate is renewed once an operator resolves that", m.State)
	}
	if gap := validity / minRenewFraction; !last.IsZero() && now.Sub(last) < gap {
		return status.Errorf(codes.ResourceExhausted, "the agent certificate was renewed %s ago; renew again after %s",
			now.Sub(last).Round(time.Millisecond), last.Add(gap).UTC().Format(time.RFC3339))
	}
	return nil
}

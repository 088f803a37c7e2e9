package enroll

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// RenewFraction is the share of its lifetime after which the agent renews its
// certificate (CONTRACTS §2.10).
const RenewFraction = 2.0 / 3.0

// renewJitter is the most the renewal is moved earlier, as a share of the lifetime, so
// that a rack enrolled together does not renew in one burst.
const renewJitter = 1.0 / 30.0

// RenewCertificate asks gpuboot for a new agent certificate for the client's key
// (RenewAgentCertificate) and returns it as PEM. The call is signed with the key, so it
// works with an expired certificate too.
func (c *Client) RenewCertificate(ctx context.Context, id *machinev1.MachineIdentity) ([]byte, error) {
	req := &bootv1.RenewAgentCertificateRequest{Identity: id}
	if err := bootv1.SignRequest(c.Key, bootv1.EnrollmentService_RenewAgentCertificate_FullMethodName, req, c.now()); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.service().RenewAgentCertificate(cctx, req)
	if err != nil {
		return nil, fmt.Errorf("RenewAgentCertificate: %w", err)
	}
	if resp.GetAgentCertificatePem() == "" {
		return nil, errors.New("RenewAgentCertificate: empty answer")
	}
	return []byte(resp.GetAgentCertificatePem()), nil
}

// Renewable is the agent certificate that a Renewal keeps fresh;
// agent/joinbundle.Credentials implements it.
type Renewable interface {
	// Current is the certificate in use.
	Current() *x509.Certificate
	// Renew checks a renewed certificate (PEM) and puts it in use.
	Renew(certPEM []byte) (*x509.Certificate, error)
}

// Renewal renews the agent certificate through gpuboot at two thirds of its lifetime
// (RenewFraction, up to a thirtieth of the lifetime earlier at random), retrying with
// backoff until gpuboot issues one, and reconnects the client so that its calls use
// the new certificate. An expired certificate is renewed at once.
type Renewal struct {
	Client   *Client
	Identity *machinev1.MachineIdentity
	Cert     Renewable
	// Renewed, when set, is called with each certificate put in use (the node keeps it
	// beside its JoinBundle).
	Renewed func(*x509.Certificate)
	Log     *slog.Logger
}

// Run renews until ctx ends.
func (r *Renewal) Run(ctx context.Context) {
	for {
		cur := r.Cert.Current()
		at := renewTime(cur, rand.Float64())
		r.Log.Info("agent certificate renewal scheduled", "serial", cur.SerialNumber.Text(16),
			"not_after", cur.NotAfter.UTC().Format(time.RFC3339), "renew_at", at.UTC().Format(time.RFC3339Nano))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		if err := renewBackoff(pki.Lifetime(cur)).Do(ctx, r.renewOnce, func(f retry.Failure) {
			r.Log.Warn("agent certificate not renewed; retrying", "attempt", f.Attempt, "in", f.Wait, "error", f.Err,
				"not_after", cur.NotAfter.UTC().Format(time.RFC3339))
		}); err != nil {
			return // ctx ended
		}
	}
}

// renewOnce asks gpuboot for a certificate, puts it in use and reconnects.
func (r *Renewal) renewOnce(ctx context.Context) error {
	pem, err := r.Client.RenewCertificate(ctx, r.Identity)
	if err != nil {
		return err
	}
	cert, err := r.Cert.Renew(pem)
	if err != nil {
		return err
	}
	if err := r.Client.Reconnect(); err != nil {
		return err
	}
	r.Log.Info("agent certificate renewed", "serial", cert.SerialNumber.Text(16), "not_after", cert.NotAfter.UTC().Format(time.RFC3339))
	if r.Renewed != nil {
		r.Renewed(cert)
	}
	return nil
}

// renewTime is when cert is renewed: at RenewFraction of its lifetime, moved earlier by
// jitter (0 to 1) times renewJitter of the lifetime.
func renewTime(cert *x509.Certificate, jitter float64) time.Time {
	early := time.Duration(float64(pki.Lifetime(cert)) * renewJitter * jitter)
	return pki.RenewAt(cert, RenewFraction).Add(-early)
}

// renewBackoff is the wait between failed renewals of a certificate valid for
// lifetime: a hundredth of it (at most a second) doubling to a twentieth (at most five
// minutes), so that a certificate of a few minutes in a test still gets many tries
// before it expires and one of a year does not hammer an unreachable gpuboot.
func renewBackoff(lifetime time.Duration) retry.Backoff {
	first := min(time.Second, max(lifetime/100, 10*time.Millisecond))
	return retry.Backoff{First: first, Max: min(5*time.Minute, max(lifetime/20, first))}
}

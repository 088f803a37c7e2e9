package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// WaitingForApproval is what Status and the console say while Register answers PENDING.
const WaitingForApproval = "waiting for approval"

// HeartbeatInterval is how often the agent heartbeats unless gpuboot says otherwise
// (CONTRACTS §2.6).
const HeartbeatInterval = 10 * time.Second

// Progress is called on every change of the agent's enrollment state: the state, a
// human-readable message, and gpuboot's machine state as a lowercase word ("" when not
// known).
type Progress func(state agentv1.EnrollmentState, message, machineState string)

// Client talks to gpuboot's EnrollmentService. Before the bundle every call is signed
// with Key (RequestAuth); after UseCertificate, calls go over mutual TLS with the agent
// certificate and are signed as well (gpuboot accepts either; the signature costs
// nothing and keeps one code path).
type Client struct {
	Target Target
	Key    ed25519.PrivateKey
	// Facts is sent with every Register.
	Facts *machinev1.MachineFacts
	// PreApproval runs the checklist to send before approval (CONTRACTS §2.3); nil: none.
	PreApproval func() *machinev1.Checklist
	Progress    Progress
	Log         *slog.Logger
	// MaxBackoff caps the wait between Register polls (default 30 s).
	MaxBackoff time.Duration
	// Now is the clock requests are signed with (default time.Now).
	Now func() time.Time
	// TPM, when set, is the machine's TPM: every Register carries its attestation,
	// and a TpmChallenge in an answer is answered in the next Register at once
	// (decision 0650). Nil: the machine has no usable TPM.
	TPM TPMProver

	mu     sync.Mutex
	conn   *grpc.ClientConn
	svc    bootv1.EnrollmentServiceClient
	tlsCfg *tls.Config
	seq    uint64
	// cert is set once the connection presents the agent certificate
	// (UseCertificate): while it is valid, heartbeats leave out RequestAuth, as the
	// contract says, so that gpuboot authenticates them by the certificate and answers
	// with what it gives only over mutual TLS (the gossip key ring, revocations,
	// data-disk wipes). An expired certificate is not presented, and heartbeats are
	// signed with the key until a renewal brings a valid one.
	cert AgentCertificate
	// answer is the TPM activation the next Register carries.
	answer *bootv1.TpmActivation
}

// TPMProver is a TPM as enrollment uses it; agent/attest.Attester implements it.
type TPMProver interface {
	// Attestation returns the EK and AK public parts, without an activation.
	Attestation() *bootv1.TpmAttestation
	// Activate answers gpuboot's credential challenge.
	Activate(*bootv1.TpmChallenge) (*bootv1.TpmActivation, error)
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Client) progress(s agentv1.EnrollmentState, msg, ms string) {
	if c.Progress != nil {
		c.Progress(s, msg, ms)
	}
}

// Dial connects to Target with the CA pinned and no client certificate.
func (c *Client) Dial() error {
	if err := c.Target.Validate(); err != nil {
		return err
	}
	return c.dial(pki.ClientConfigPinned(c.Target.Pin))
}

// AgentCertificate is the agent certificate as the client presents it: the one in use
// at each TLS handshake (renewal replaces it), and whether it is valid now.
// agent/joinbundle.Credentials implements it.
type AgentCertificate interface {
	GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	Valid(now time.Time) bool
}

// UseCertificate reconnects with the agent certificate for mutual TLS. Each handshake
// asks cert for the certificate in use; Reconnect makes the next calls shake hands
// again (after a renewal).
func (c *Client) UseCertificate(cert AgentCertificate) error {
	cfg := pki.ClientConfigPinned(c.Target.Pin)
	cfg.GetClientCertificate = cert.GetClientCertificate
	if err := c.dial(cfg); err != nil {
		return err
	}
	c.mu.Lock()
	c.cert = cert
	c.mu.Unlock()
	return nil
}

// Reconnect opens a new connection to gpuboot with the same TLS settings and closes
// the old one, so that the next calls shake hands with the agent certificate in use now.
func (c *Client) Reconnect() error {
	c.mu.Lock()
	cfg := c.tlsCfg
	c.mu.Unlock()
	if cfg == nil {
		return errors.New("enroll: reconnect before Dial")
	}
	return c.dial(cfg)
}

func (c *Client) dial(cfg *tls.Config) error {
	conn, err := grpc.NewClient(c.Target.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return fmt.Errorf("enroll: dial gpuboot %s: %w", c.Target.Endpoint, err)
	}
	c.mu.Lock()
	old := c.conn
	c.conn, c.svc, c.tlsCfg = conn, bootv1.NewEnrollmentServiceClient(conn), cfg
	c.mu.Unlock()
	if old != nil {
		// A call still on the old connection (a heartbeat when a renewal reconnects)
		// finishes first: every call's own timeout is at most callTimeout.
		time.AfterFunc(callTimeout, func() { old.Close() })
	}
	return nil
}

// callTimeout bounds each call to gpuboot.
const callTimeout = 30 * time.Second

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

func (c *Client) service() bootv1.EnrollmentServiceClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.svc
}

// ErrStopped is wrapped by Enroll when gpuboot's answer ends enrollment (REJECTED,
// CONFLICT, DECOMMISSIONED): only an operator changes that.
var ErrStopped = errors.New("enrollment stopped by gpuboot")

// Enroll registers until gpuboot approves, then redeems the token for the JoinBundle.
// It polls with exponential backoff (1 s doubling to MaxBackoff, with jitter,
// honouring retry_after), sends the pre-approval checklist once after the first answer,
// and reports progress. It returns when it holds the bundle, ctx ends, or gpuboot ends
// enrollment (ErrStopped).
func (c *Client) Enroll(ctx context.Context) (*bootv1.JoinBundle, error) {
	maxWait := c.MaxBackoff
	if maxWait <= 0 {
		maxWait = 30 * time.Second
	}
	fp := bootv1.KeyFingerprint(c.Key.Public().(ed25519.PublicKey))
	c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING, "registering with gpuboot at "+c.Target.Endpoint+" as key "+fp, "")
	wait, reported := time.Second, false
	for {
		resp, err := c.register(ctx)
		next := wait
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			c.Log.Warn("Register failed; retrying", "endpoint", c.Target.Endpoint, "error", err, "in", wait)
			c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING, "Register failed, retrying: "+err.Error(), "")
		default:
			ms := MachineStateWord(resp.GetMachineState())
			if !reported && c.PreApproval != nil && resp.GetStatus() != bootv1.RegisterStatus_REGISTER_STATUS_REJECTED {
				if err := c.ReportChecklist(ctx, c.PreApproval()); err != nil {
					c.Log.Warn("pre-approval checklist not delivered; will retry", "error", err)
				} else {
					reported = true
				}
			}
			switch resp.GetStatus() {
			case bootv1.RegisterStatus_REGISTER_STATUS_PENDING:
				if ch := resp.GetTpmChallenge(); ch != nil && c.TPM != nil {
					ans, err := c.TPM.Activate(ch)
					if err != nil {
						c.Log.Warn("TPM could not answer gpuboot's challenge; registering again for a new one", "error", err)
						c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING, "the TPM could not answer gpuboot's challenge, registering again: "+err.Error(), ms)
					} else {
						c.mu.Lock()
						c.answer = ans
						c.mu.Unlock()
						next = 0
					}
					break
				}
				if wait == time.Second { // first PENDING answer, or after a reset
					c.Log.Info(WaitingForApproval, "endpoint", c.Target.Endpoint, "key", fp, "machine_state", ms)
				}
				msg := WaitingForApproval
				if m := resp.GetMessage(); m != "" && !strings.HasPrefix(strings.ToLower(m), WaitingForApproval) {
					msg += ": " + m
				}
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL, msg, ms)
			case bootv1.RegisterStatus_REGISTER_STATUS_APPROVED:
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED, "approved; fetching the JoinBundle", ms)
				b, err := c.getBundle(ctx, resp.GetToken(), resp.GetChallenge())
				if err == nil {
					return b, nil
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				// NOT_FOUND: the token expired; Register again for a new one.
				c.Log.Warn("GetJoinBundle failed; registering again", "error", err)
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING, "GetJoinBundle failed, registering again: "+err.Error(), ms)
				next = time.Second
			case bootv1.RegisterStatus_REGISTER_STATUS_REJECTED:
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_REJECTED, "gpuboot rejected this machine"+nonEmpty(": ", resp.GetMessage()), ms)
				return nil, fmt.Errorf("register: rejected: %s: %w", resp.GetMessage(), ErrStopped)
			case bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT:
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_CONFLICT, "another live key claims this identity; an operator must resolve the conflict"+nonEmpty(": ", resp.GetMessage()), ms)
				return nil, fmt.Errorf("register: conflict: %s: %w", resp.GetMessage(), ErrStopped)
			case bootv1.RegisterStatus_REGISTER_STATUS_DECOMMISSIONED:
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, "machine is decommissioned in gpuboot"+nonEmpty(": ", resp.GetMessage()), ms)
				return nil, fmt.Errorf("register: decommissioned: %w", ErrStopped)
			default: // BUNDLE_RELEASED to this key earlier (agent restarted after the bundle)
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED,
					fmt.Sprintf("gpuboot answered %s: the bundle for this key was released before and is not kept by the agent; an operator can re-approve (or reboot for a new key)", resp.GetStatus()), ms)
				c.Log.Warn("Register answered a status the agent cannot continue from; polling", "status", resp.GetStatus(), "message", resp.GetMessage())
			}
			if ra := resp.GetRetryAfter(); ra != nil && ra.AsDuration() > 0 {
				next = ra.AsDuration()
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(jitter(next)):
		}
		wait = min(2*wait, maxWait)
	}
}

// jitter adds up to 20% so a rack rebooting together does not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

func nonEmpty(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

func (c *Client) register(ctx context.Context) (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: c.Facts, PublicKey: c.Key.Public().(ed25519.PublicKey)}
	if c.TPM != nil {
		req.Tpm = c.TPM.Attestation()
		c.mu.Lock()
		req.Tpm.Activation, c.answer = c.answer, nil
		c.mu.Unlock()
	}
	if err := bootv1.SignRequest(c.Key, bootv1.EnrollmentService_Register_FullMethodName, req, c.now()); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.service().Register(cctx, req)
}

func (c *Client) getBundle(ctx context.Context, token string, challenge []byte) (*bootv1.JoinBundle, error) {
	req := &bootv1.GetJoinBundleRequest{Token: token, Signature: bootv1.SignJoinBundle(c.Key, challenge, token)}
	if err := bootv1.SignRequest(c.Key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, c.now()); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.service().GetJoinBundle(cctx, req)
	if err != nil {
		return nil, fmt.Errorf("GetJoinBundle: %w", err)
	}
	if resp.GetBundle() == nil {
		return nil, errors.New("GetJoinBundle: empty answer")
	}
	return resp.GetBundle(), nil
}

// ReportChecklist sends a checklist (any phase) with ReportCommissioning and returns
// gpuboot's answer.
func (c *Client) ReportChecklist(ctx context.Context, cl *machinev1.Checklist) error {
	_, err := c.Report(ctx, cl)
	return err
}

// Report sends a checklist and returns gpuboot's answer.
func (c *Client) Report(ctx context.Context, cl *machinev1.Checklist) (*bootv1.ReportCommissioningResponse, error) {
	if cl == nil {
		return nil, errors.New("ReportCommissioning: no checklist")
	}
	req := &bootv1.ReportCommissioningRequest{Report: cl}
	if err := bootv1.SignRequest(c.Key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, c.now()); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.service().ReportCommissioning(cctx, req)
	if err != nil {
		return nil, fmt.Errorf("ReportCommissioning (%s): %w", cl.GetPhase(), err)
	}
	return resp, nil
}

// HeartbeatFields is what a heartbeat carries besides the bookkeeping the client adds.
type HeartbeatFields struct {
	Identity       *machinev1.MachineIdentity
	NodeName       string
	Health         *machinev1.HealthSummary
	ImageID        string
	DriverVersion  string
	BootID         string
	AgentStartedAt time.Time
	// GossipKeyring is the digest of the gossip key ring in use (bootv1.GossipKeyringDigest).
	GossipKeyring string
	// RevocationsDigest is the digest of the revocation list held (pki.RevocationList.Digest).
	RevocationsDigest string
	// GPUAllocation is which pods hold the GPUs; nil where the agent cannot tell.
	GPUAllocation *machinev1.GPUAllocation
	// DataDisks is the latest look at the local disks; nil before the first.
	// WipeResult is the outcome of a data-disk wipe gpuboot has not recorded yet.
	DataDisks  *machinev1.DataDisks
	WipeResult *machinev1.DataDiskWipeResult
}

// Heartbeat sends one heartbeat. The answer's interval (when set) is the time to the
// next one.
func (c *Client) Heartbeat(ctx context.Context, f HeartbeatFields) (*bootv1.HeartbeatResponse, error) {
	c.mu.Lock()
	c.seq++
	seq, cert := c.seq, c.cert
	c.mu.Unlock()
	mtls := cert != nil && cert.Valid(c.now())
	req := &bootv1.HeartbeatRequest{Identity: f.Identity, NodeName: f.NodeName, Health: f.Health, ImageId: f.ImageID,
		DriverVersion: f.DriverVersion, BootId: f.BootID, Sequence: seq, SentAt: timestamppb.New(c.now()), GossipKeyring: f.GossipKeyring, RevocationsDigest: f.RevocationsDigest,
		GpuAllocation: f.GPUAllocation, DataDisks: f.DataDisks, WipeResult: f.WipeResult}
	if !f.AgentStartedAt.IsZero() {
		req.AgentStartedAt = timestamppb.New(f.AgentStartedAt)
	}
	if !mtls {
		if err := bootv1.SignRequest(c.Key, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, c.now()); err != nil {
			return nil, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.service().Heartbeat(cctx, req)
}

// Heartbeats sends a heartbeat at once and then every HeartbeatInterval (or the
// interval gpuboot answers with), built by fields each time, until ctx ends. It calls
// onAnswer with every answer (machine state and message). kick, when it receives,
// sends one at once (a health change).
func (c *Client) Heartbeats(ctx context.Context, fields func() HeartbeatFields, kick <-chan struct{}, onAnswer func(*bootv1.HeartbeatResponse)) {
	every := HeartbeatInterval
	for {
		resp, err := c.Heartbeat(ctx, fields())
		switch {
		case err != nil && ctx.Err() == nil:
			c.Log.Warn("heartbeat failed", "error", err)
			if status.Code(err) == codes.PermissionDenied {
				c.progress(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, "gpuboot refused the heartbeat: "+err.Error(), "")
			}
		case err == nil:
			if iv := resp.GetInterval(); iv != nil && iv.AsDuration() > 0 {
				every = iv.AsDuration()
			}
			if onAnswer != nil {
				onAnswer(resp)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-time.After(every):
		}
	}
}

// MachineStateWord is a MachineState as the lowercase word EnrollmentStatus uses
// ("ready", "quarantined"); "" when unspecified.
func MachineStateWord(s bootv1.MachineState) string {
	if s == bootv1.MachineState_MACHINE_STATE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "MACHINE_STATE_"))
}

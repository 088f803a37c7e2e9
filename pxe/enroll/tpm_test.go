package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/agent/attest"
	agentenroll "github.com/gpurack/gpurack/agent/enroll"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/swtpmtest"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// The tests of this file run the TPM-bound identity (decisions 0650, 0651) against
// real software TPMs (swtpm): each has its own Endorsement Key, and one restarted on
// its state folder is the same TPM after a reboot.

// tpmAgent is a test agent with a TPM.
type tpmAgent struct {
	*agent
	tpm *attest.Attester
}

func withTPM(a *agent, t *attest.Attester) *tpmAgent { return &tpmAgent{agent: a, tpm: t} }

// registerTPM registers with the TPM's attestation and the activation ans (nil: none).
func (a *tpmAgent) registerTPM(att *bootv1.TpmAttestation, ans *bootv1.TpmActivation) (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: a.facts, PublicKey: a.key.Public().(ed25519.PublicKey)}
	req.Tpm = att
	req.Tpm.Activation = ans
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, a.e.clk.Now()); err != nil {
		a.e.t.Fatal(err)
	}
	return a.c.Register(context.Background(), req)
}

// challenge registers without an answer and returns gpuboot's TPM challenge.
func (a *tpmAgent) challenge() *bootv1.TpmChallenge {
	a.e.t.Helper()
	r, err := a.registerTPM(a.tpm.Attestation(), nil)
	if err != nil {
		a.e.t.Fatalf("register for a TPM challenge: %v", err)
	}
	if r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING || r.TpmChallenge == nil {
		a.e.t.Fatalf("register: %s (%s) without a TPM challenge", r.Status, r.Message)
	}
	return r.TpmChallenge
}

// prove runs the challenge round and returns the answer to the Register that carried
// the activation.
func (a *tpmAgent) prove() (*bootv1.RegisterResponse, error) {
	a.e.t.Helper()
	ans, err := a.tpm.Activate(a.challenge())
	if err != nil {
		a.e.t.Fatalf("activate: %v", err)
	}
	return a.registerTPM(a.tpm.Attestation(), ans)
}

func (a *tpmAgent) mustProve(want bootv1.RegisterStatus) *bootv1.RegisterResponse {
	a.e.t.Helper()
	r, err := a.prove()
	if err != nil {
		a.e.t.Fatalf("register with the TPM answer: %v", err)
	}
	if r.Status != want {
		a.e.t.Fatalf("register with the TPM answer: %s (%s), want %s", r.Status, r.Message, want)
	}
	return r
}

// poll registers again with the attestation and no answer (what the agent does after
// proving).
func (a *tpmAgent) poll(want bootv1.RegisterStatus) *bootv1.RegisterResponse {
	a.e.t.Helper()
	r, err := a.registerTPM(a.tpm.Attestation(), nil)
	if err != nil {
		a.e.t.Fatalf("register: %v", err)
	}
	if r.Status != want || r.TpmChallenge != nil {
		a.e.t.Fatalf("register: %s (%s, challenge %v), want %s without a challenge", r.Status, r.Message, r.TpmChallenge != nil, want)
	}
	return r
}

// fetch redeems an approval and returns an mTLS client with the agent certificate and
// the certificate's serial.
func (a *tpmAgent) fetch(r *bootv1.RegisterResponse) (bootv1.EnrollmentServiceClient, *big.Int) {
	a.e.t.Helper()
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil {
		a.e.t.Fatalf("GetJoinBundle: %v", err)
	}
	cert, err := pki.DecodeCertPEM([]byte(b.AgentCertificatePem))
	if err != nil {
		a.e.t.Fatal(err)
	}
	return a.e.client(tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert}), cert.SerialNumber
}

func ekHashOf(t *testing.T, a *attest.Attester) string {
	t.Helper()
	p, err := parseAttestation(a.Attestation())
	if err != nil {
		t.Fatal(err)
	}
	return p.EKHash
}

// (a) A machine with TPM A enrolls and is approved by an operator, which binds its EK.
// After a reboot (a new enrollment key, the same TPM) it re-enrolls at once, without an
// operator, even with `reenroll: manual` and its old key still counted live; the old
// key's certificate is revoked.
func TestTPMRebootReenrollsWithoutOperator(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Identity, c.Reenroll = IdentityTPM, ReenrollManual })
	const mac = "52:54:00:00:07:01"
	tpmA := swtpmtest.Start(t)
	a := withTPM(e.agent(mac, "SN-TPM-A"), tpmA.Attester(t))
	a.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	a.poll(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(mac)
	m := e.machine(mac)
	if m.EKHash != ekHashOf(t, a.tpm) {
		t.Fatalf("EK bound at approval: %q, want %q", m.EKHash, ekHashOf(t, a.tpm))
	}
	mtls, serial := a.fetch(a.poll(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED))
	if _, err := a.heartbeat(mtls, false); err != nil {
		t.Fatal(err)
	}

	// Reboot: the TPM powers off and on, the agent makes a new key.
	a.tpm.Close()
	tpmA.Stop()
	b := withTPM(a.rebooted(), swtpmtest.StartIn(t, tpmA.Dir).Attester(t))
	r := b.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b.fetch(r)
	m = e.machine(mac)
	if m.BoundKey != b.fp() || len(m.Keys) != 1 || m.EKHash != ekHashOf(t, b.tpm) {
		t.Fatalf("after the reboot: bound %s (want %s), %d keys, EK %s", short(m.BoundKey), short(b.fp()), len(m.Keys), m.EKHash)
	}
	if !e.svc.cfg.Revocations.Contains(serial) {
		t.Fatal("the old key's agent certificate was not revoked")
	}
	h, err := e.store.History(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	byTPM := false
	for _, tr := range h {
		byTPM = byTPM || (tr.Actor == "policy:tpm-same-ek" && tr.To == inventory.Approved)
	}
	if !byTPM {
		t.Fatalf("no approval by policy:tpm-same-ek in the history: %+v", h)
	}
	e.checkHistory(mac)
}

// (b) A forged identity (the same MAC, UUID and serial) from another TPM gets nothing:
// no approval, no token, no certificate revoked; the machine goes to conflict for an
// operator while its real agent keeps working, and the operator can keep the real key.
// Under tpm-or-fallback an agent without a TPM claiming the EK-bound identity fares
// the same.
func TestTPMForgedIdentityFromAnotherTPMIsConflict(t *testing.T) {
	for _, mode := range []IdentityMode{IdentityTPM, IdentityTPMOrFallback} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Identity, c.Reenroll = mode, ReenrollAuto })
			const mac = "52:54:00:00:07:02"
			a := withTPM(e.agent(mac, "SN-TPM-B"), swtpmtest.Start(t).Attester(t))
			a.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
			e.approve(mac)
			mtls, serial := a.fetch(a.poll(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED))

			forger := withTPM(a.rebooted(), swtpmtest.Start(t).Attester(t))
			for i := 0; i < 2; i++ {
				// The first call proves the forger's TPM; the second is a poll by the
				// key that proved it.
				var r *bootv1.RegisterResponse
				var err error
				if i == 0 {
					r, err = forger.prove()
				} else {
					r, err = forger.registerTPM(forger.tpm.Attestation(), nil)
				}
				if err != nil {
					t.Fatalf("forger's register %d: %v", i, err)
				}
				if r.Status != bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT || r.Token != "" {
					t.Fatalf("forger's register %d: %s with token %q (%s), want CONFLICT and nothing", i, r.Status, r.Token, r.Message)
				}
				if !strings.Contains(r.Message, ekHashOf(t, a.tpm)) {
					t.Fatalf("conflict message does not name the bound EK: %s", r.Message)
				}
			}
			if mode == IdentityTPMOrFallback {
				plain := a.rebooted()
				r, err := plain.register()
				if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT || r.Token != "" {
					t.Fatalf("agent without a TPM claiming the bound identity: %v, %v; want CONFLICT", r, err)
				}
			}
			m := e.machine(mac)
			if m.State != inventory.Conflict || m.BoundKey != a.fp() || m.EKHash != ekHashOf(t, a.tpm) {
				t.Fatalf("after the forgery: %s, bound %s, EK %s", m.State, short(m.BoundKey), short(m.EKHash))
			}
			if e.svc.cfg.Revocations.Contains(serial) {
				t.Fatal("the real agent's certificate was revoked")
			}
			if _, err := a.heartbeat(mtls, false); err != nil {
				t.Fatalf("the real agent's heartbeat during the conflict: %v", err)
			}
			if _, err := e.svc.ResolveConflict(context.Background(), mac, a.fp(), "operator:test", "forged identity"); err != nil {
				t.Fatal(err)
			}
			m = e.machine(mac)
			if m.State != inventory.Joining || m.BoundKey != a.fp() || m.EKHash != ekHashOf(t, a.tpm) || len(m.Keys) != 1 {
				t.Fatalf("after resolving for the real key: %s, bound %s, EK %s, %d keys", m.State, short(m.BoundKey), short(m.EKHash), len(m.Keys))
			}
			e.checkHistory(mac)
		})
	}
}

// (c) Under `identity: tpm` an agent without a TPM is refused with an error that says
// what to do, and nothing is stored; under tpm-or-fallback it enrolls as before, and
// under the default mac-uuid-serial the TPM is not asked for.
func TestTPMRequiredRefusesAgentWithoutTPM(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Identity = IdentityTPM })
	const mac = "52:54:00:00:07:03"
	_, err := e.agent(mac, "SN-NO-TPM").register()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "requires TPM attestation") || !strings.Contains(err.Error(), "tpm-or-fallback") {
		t.Fatalf("register without a TPM: %v, want FailedPrecondition naming the fix", err)
	}
	if _, err := e.svc.Resolve(context.Background(), mac); err == nil {
		t.Fatal("a machine was recorded for the refused agent")
	}

	f := newEnv(t, func(c *Config) { c.Identity = IdentityTPMOrFallback })
	f.agent(mac, "SN-NO-TPM").mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if m := f.machine(mac); m.State != inventory.Registered || m.EKHash != "" {
		t.Fatalf("tpm-or-fallback without a TPM: %s, EK %q", m.State, m.EKHash)
	}

	d := newEnv(t, nil)
	a := withTPM(d.agent(mac, "SN-TPM-D"), swtpmtest.Start(t).Attester(t))
	r, err := a.registerTPM(a.tpm.Attestation(), nil)
	if err != nil || r.TpmChallenge != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
		t.Fatalf("default mode with a TPM: %v, %v; want PENDING without a challenge", r, err)
	}
}

// (d) A wrong activation answer is refused, and so is any answer to a challenge that
// was used already, expired, or made for another key, including a stranger who sends
// the victim's public EK and AK (which are not secret) and replays the victim's answer.
func TestTPMWrongOrReplayedAnswerRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Identity = IdentityTPM })
	const mac = "52:54:00:00:07:04"
	a := withTPM(e.agent(mac, "SN-TPM-D"), swtpmtest.Start(t).Attester(t))

	ch := a.challenge()
	wrong := &bootv1.TpmActivation{ChallengeId: ch.Id, Secret: make([]byte, tpmSecretSize)}
	if _, err := a.registerTPM(a.tpm.Attestation(), wrong); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("wrong secret: %v, want PermissionDenied", err)
	}
	// The challenge is gone with the wrong answer: the right one no longer counts.
	right, err := a.tpm.Activate(ch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.registerTPM(a.tpm.Attestation(), right); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("answer after a wrong one: %v, want FailedPrecondition", err)
	}
	// An answer to an older challenge, after a new one was issued.
	old := a.challenge()
	oldAns, err := a.tpm.Activate(old)
	if err != nil {
		t.Fatal(err)
	}
	a.challenge()
	if _, err := a.registerTPM(a.tpm.Attestation(), oldAns); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("answer to a superseded challenge: %v, want FailedPrecondition", err)
	}
	// An expired challenge.
	late := a.challenge()
	lateAns, err := a.tpm.Activate(late)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Add(tpmChallengeTTL + 1)
	if _, err := a.registerTPM(a.tpm.Attestation(), lateAns); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("answer to an expired challenge: %v, want FailedPrecondition", err)
	}
	if _, err := e.svc.Resolve(context.Background(), mac); err == nil {
		t.Fatal("a machine was recorded before any key proved its TPM")
	}
	// The real agent proves its TPM.
	ch = a.challenge()
	good, err := a.tpm.Activate(ch)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := a.registerTPM(a.tpm.Attestation(), good); err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
		t.Fatalf("right answer: %v, %v", r, err)
	}
	// A stranger with its own key sends the victim's EK and AK and replays the
	// victim's answer: it has no challenge of its own with that id.
	s := withTPM(a.rebooted(), a.tpm)
	if _, err := s.registerTPM(a.tpm.Attestation(), good); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replayed answer from another key: %v, want FailedPrecondition", err)
	}
	// Asked for its own challenge, it cannot answer without the TPM: a guess is wrong.
	sch, err := s.registerTPM(a.tpm.Attestation(), nil)
	if err != nil || sch.TpmChallenge == nil {
		t.Fatalf("stranger's challenge: %v, %v", sch, err)
	}
	guess := &bootv1.TpmActivation{ChallengeId: sch.TpmChallenge.Id, Secret: good.Secret}
	if _, err := s.registerTPM(a.tpm.Attestation(), guess); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("stranger's guess: %v, want PermissionDenied", err)
	}
	if m := e.machine(mac); len(m.Keys) != 1 || m.Keys[0].Fingerprint != a.fp() || m.Keys[0].EKHash != ekHashOf(t, a.tpm) {
		t.Fatalf("keys after the attempts: %+v", m.Keys)
	}
}

// A vendor manifest's ekHash column binds the identity before the first approval: the
// TPM it names is approved by its row, another TPM on the same row is a conflict.
func TestTPMManifestEKHash(t *testing.T) {
	tpmA := swtpmtest.Start(t).Attester(t)
	csv := "serial,mac,ekHash\nSN-TPM-M,52:54:00:00:07:05," + ekHashOf(t, tpmA) + "\nSN-TPM-N,52:54:00:00:07:06,sha256:" + strings.Repeat("ab", 32) + "\n"
	list, err := policy.ParseListBytes("manifest.csv", []byte(csv))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Identity = IdentityTPM
		c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
	})
	a := withTPM(e.agent("52:54:00:00:07:05", "SN-TPM-M"), tpmA)
	a.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	if m := e.machine("52:54:00:00:07:05"); m.EKHash != ekHashOf(t, tpmA) {
		t.Fatalf("EK bound: %q", m.EKHash)
	}
	b := withTPM(e.agent("52:54:00:00:07:06", "SN-TPM-N"), swtpmtest.Start(t).Attester(t))
	r := b.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT)
	if r.Token != "" {
		t.Fatal("a TPM the manifest does not name got a token")
	}
	e.checkHistory("52:54:00:00:07:06")
}

// The agent's enrollment client with a real TPM goes through the challenge round on
// its own and receives its bundle (`identity: tpm`, approval auto).
func TestTPMAgentClientEnrolls(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Identity = IdentityTPM
		c.Policy = policy.Policy{Mode: policy.Auto}
	})
	tpm := swtpmtest.Start(t).Attester(t)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	const mac = "52:54:00:00:07:07"
	c := &agentenroll.Client{
		Target: agentenroll.Target{Endpoint: e.addr, Pin: e.ca.Pin()}, Key: key, TPM: tpm, Now: e.clk.Now,
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Facts: &machinev1.MachineFacts{Identity: &machinev1.MachineIdentity{BootMac: mac, Serial: "SN-TPM-C"}},
	}
	if err := c.Dial(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.Enroll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := e.machine(mac)
	if b.GetNodeName() == "" || m.EKHash != ekHashOf(t, tpm) || m.BoundKey != bootv1.KeyFingerprint(key.Public().(ed25519.PublicKey)) {
		t.Fatalf("bundle for %q; machine EK %s, bound %s", b.GetNodeName(), m.EKHash, m.BoundKey)
	}
}

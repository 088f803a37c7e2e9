package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/agent/attest"
	"github.com/gpurack/gpurack/agent/attest/attesttest"
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
	a := withTPM(e.agent(mac, "SN-TPM-A"), attesttest.New(t, tpmA))
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
	b := withTPM(a.rebooted(), attesttest.New(t, swtpmtest.StartIn(t, tpmA.Dir)))
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
			a := withTPM(e.agent(mac, "SN-TPM-B"), attesttest.New(t, swtpmtest.Start(t)))
			a.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
			e.approve(mac)
			mtls, serial := a.fetch(a.poll(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED))

			forger := withTPM(a.rebooted(), attesttest.New(t, swtpmtest.Start(t)))
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
	a := withTPM(d.agent(mac, "SN-TPM-D"), attesttest.New(t, swtpmtest.Start(t)))
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
	a := withTPM(e.agent(mac, "SN-TPM-D"), attesttest.New(t, swtpmtest.Start(t)))

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
// TPM it names is approved by its row; another TPM is refused on a row not bound yet,
// and is a conflict on the bound machine's identity.
func TestTPMManifestEKHash(t *testing.T) {
	tpmA := attesttest.New(t, swtpmtest.Start(t))
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
	// Another TPM on a row whose machine is not bound yet is refused, nothing stored
	// (issue 33); on the bound machine's identity it is a conflict an operator sees.
	b := withTPM(e.agent("52:54:00:00:07:06", "SN-TPM-N"), attesttest.New(t, swtpmtest.Start(t)))
	if _, err := b.prove(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a TPM the manifest does not name, on an unbound row: %v; want PermissionDenied", err)
	}
	forger := withTPM(a.rebooted(), attesttest.New(t, swtpmtest.Start(t)))
	if r := forger.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT); r.Token != "" {
		t.Fatal("a TPM the manifest does not name got a token")
	}
	e.checkHistory("52:54:00:00:07:05")
}

// The agent's enrollment client with a real TPM goes through the challenge round on
// its own and receives its bundle (`identity: tpm`, approval auto).
func TestTPMAgentClientEnrolls(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Identity = IdentityTPM
		c.Policy = policy.Policy{Mode: policy.Auto}
	})
	tpm := attesttest.New(t, swtpmtest.Start(t))
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

// clientFrom dials the service from the loopback address src (all of 127.0.0.0/8 is
// local on Linux), so the service sees another source than 127.0.0.1.
func (e *env) clientFrom(src string) bootv1.EnrollmentServiceClient {
	e.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfigPinned(e.ca.Pin()))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return bootv1.NewEnrollmentServiceClient(conn)
}

// askChallenge is a stranger's Register: a fresh enrollment key, the identity id and
// the TPM attestation att, no answer. It returns the call's error (nil: a challenge).
func askChallenge(t *testing.T, c bootv1.EnrollmentServiceClient, id *machinev1.MachineIdentity, att *bootv1.TpmAttestation) error {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	req := &bootv1.RegisterRequest{PublicKey: key.Public().(ed25519.PublicKey), Tpm: &bootv1.TpmAttestation{EkPublic: att.EkPublic, AkPublic: att.AkPublic, EkCertificate: att.EkCertificate},
		Facts: &machinev1.MachineFacts{Identity: id}}
	if err := bootv1.SignRequest(key, bootv1.EnrollmentService_Register_FullMethodName, req, time.Now()); err != nil {
		t.Fatal(err)
	}
	r, err := c.Register(context.Background(), req)
	if err == nil && r.TpmChallenge == nil {
		t.Fatalf("stranger's register: %s (%s) without a TPM challenge", r.Status, r.Message)
	}
	return err
}

// flood sends calls Registers for identity id from each of the sources numbered
// first … first+sources-1 (127.0.N/256.N%256) at once, each with the attestation
// att(), and returns how many got a challenge. Every refusal must be
// ResourceExhausted.
func flood(t *testing.T, e *env, first, sources, calls int, id *machinev1.MachineIdentity, att func() *bootv1.TpmAttestation) int {
	t.Helper()
	var got atomic.Int64
	var wg sync.WaitGroup
	for s := range sources {
		n := first + s
		c := e.clientFrom(fmt.Sprintf("127.0.%d.%d", n>>8, n&255))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				err := askChallenge(t, c, id, att())
				if err == nil {
					got.Add(1)
				} else if status.Code(err) != codes.ResourceExhausted {
					t.Errorf("flood register: %v, want a challenge or ResourceExhausted", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return int(got.Load())
}

// TestTPMChallengeFlood performs issue 33's attack on the open TPM challenges: a
// stranger with no TPM asks for challenges with one software-made EK from 100
// addresses, then with a new EK on every call from one address, then with new EKs
// from 100 addresses, and then with a known machine's public EK and AK from 100
// addresses. Each flood holds only its share (per EK, per address); afterwards a new
// machine with a real (software) TPM gets its challenge and enrolls, and a known
// machine after a reboot gets its challenge and re-enrolls without an operator.
func TestTPMChallengeFlood(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Identity = IdentityTPM })
	const knownMAC, newMAC = "52:54:00:00:07:21", "52:54:00:00:07:22"
	tpmK := swtpmtest.Start(t)
	known := withTPM(e.agent(knownMAC, "SN-TPM-K"), attesttest.New(t, tpmK))
	known.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	e.approve(knownMAC)
	known.fetch(known.poll(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED))

	stranger := &machinev1.MachineIdentity{BootMac: "52:54:00:00:07:30", Serial: "SN-FLOOD"}
	fresh := func() *bootv1.TpmAttestation { a, _ := sampleAttestation(t); return a }
	one := fresh()
	if n := flood(t, e, 2, 100, 12, stranger, func() *bootv1.TpmAttestation { return one }); n != maxChallengesPerEK {
		t.Fatalf("one EK from 100 addresses, 1200 calls: %d challenges open, want %d (maxChallengesPerEK)", n, maxChallengesPerEK)
	}
	if n := flood(t, e, 200, 1, 3*maxChallengesPerSource, stranger, fresh); n != maxChallengesPerSource {
		t.Fatalf("a new EK on each of %d calls from one address: %d challenges open, want %d (maxChallengesPerSource)", 3*maxChallengesPerSource, n, maxChallengesPerSource)
	}
	many := flood(t, e, 300, 100, maxChallengesPerSource+2, stranger, fresh)
	if many != 100*maxChallengesPerSource {
		t.Fatalf("new EKs from 100 addresses: %d challenges open, want %d per address", many, maxChallengesPerSource)
	}
	// The known machine's EK and AK are public: a stranger sends them for the known
	// identity from 100 addresses.
	knownAtt := known.tpm.Attestation()
	stolen := flood(t, e, 500, 100, maxChallengesPerSource, known.facts.Identity, func() *bootv1.TpmAttestation { return knownAtt })
	t.Logf("open challenges after the floods: %d with one EK, %d with new EKs, %d with the known EK; table %d (strangers %d)",
		maxChallengesPerEK, maxChallengesPerSource+many, stolen, e.svc.tpm.len(), e.svc.tpm.strangers.Len())
	if e.svc.tpm.strangers.Len() > strangerChallenges {
		t.Fatalf("%d stranger challenges open, above their share of %d", e.svc.tpm.strangers.Len(), strangerChallenges)
	}

	newcomer := withTPM(e.agent(newMAC, "SN-TPM-NEW"), attesttest.New(t, swtpmtest.Start(t)))
	newcomer.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if m := e.machine(newMAC); m.State != inventory.Registered || m.Keys[0].EKHash != ekHashOf(t, newcomer.tpm) {
		t.Fatalf("new machine after the floods: %s, EK %q", m.State, m.Keys[0].EKHash)
	}

	known.tpm.Close()
	tpmK.Stop()
	back := withTPM(known.rebooted(), attesttest.New(t, swtpmtest.StartIn(t, tpmK.Dir)))
	back.fetch(back.mustProve(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED))
	if m := e.machine(knownMAC); m.BoundKey != back.fp() {
		t.Fatalf("known machine after a reboot during the floods: bound %s, want %s", short(m.BoundKey), short(back.fp()))
	}
}

// TestTPMChallengeTableFull: with the table full, a stranger's challenge is refused
// once the strangers hold their share, while a known EK's takes the place of the
// oldest; expired challenges make room again.
func TestTPMChallengeTableFull(t *testing.T) {
	var c tpmChallenges
	now := time.Unix(1_700_000_000, 0)
	src := func(i int) netip.Prefix {
		return SourcePrefix(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	p := func(i int, known bool) pendingTPM {
		return pendingTPM{ekHash: fmt.Sprintf("sha256:%d", i), expires: now.Add(tpmChallengeTTL), source: src(i), known: known}
	}
	for i := range strangerChallenges {
		if err := c.put(fmt.Sprint("s", i), p(i, false), now); err != nil {
			t.Fatalf("stranger %d within the share: %v", i, err)
		}
	}
	if err := c.put("s-over", p(strangerChallenges, false), now); err == nil || !strings.Contains(err.Error(), "no machine is bound to") {
		t.Fatalf("stranger beyond the share: %v", err)
	}
	for i := range maxPendingTPMChecks - strangerChallenges {
		if err := c.put(fmt.Sprint("k", i), p(i+1<<20, true), now); err != nil {
			t.Fatalf("known %d in the reserve: %v", i, err)
		}
	}
	if err := c.put("k-more", p(2<<20, true), now); err != nil {
		t.Fatalf("known EK with the table full: %v", err)
	}
	if _, ok := c.take("s0", now); ok || c.len() != maxPendingTPMChecks {
		t.Fatalf("the oldest challenge was not replaced (table %d)", c.len())
	}
	if _, ok := c.take("k-more", now); !ok {
		t.Fatal("the known EK's challenge is not open")
	}
	now = now.Add(tpmChallengeTTL)
	// Expired challenges go when a bound is reached: the strangers' share first.
	for i := range 2 {
		if err := c.put(fmt.Sprint("s-later", i), p(3<<20+i, false), now); err != nil {
			t.Fatalf("stranger %d after every challenge expired: %v", i, err)
		}
	}
	if c.len() != 2 || len(c.bySource) != 2 || len(c.byEK) != 2 {
		t.Fatalf("after the sweep: %d challenges, %d sources, %d EKs counted", c.len(), len(c.bySource), len(c.byEK))
	}
}

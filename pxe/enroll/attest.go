package enroll

import (
	"bytes"
	"container/list"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// IdentityMode says what a machine's identity rests on (gpuboot.yaml `identity`,
// decisions 0650 and 0651).
type IdentityMode string

// The identity modes.
const (
	// IdentityMACUUIDSerial trusts the MAC, SMBIOS UUID and serial an agent reports,
	// which anyone on the provisioning network can read and repeat. The default: it is
	// what gpuboot did before TPM attestation, and TPM fields are ignored.
	IdentityMACUUIDSerial IdentityMode = "mac-uuid-serial"
	// IdentityTPM requires every agent to prove a TPM 2.0 Endorsement Key; an agent
	// without a TPM is refused.
	IdentityTPM IdentityMode = "tpm"
	// IdentityTPMOrFallback requires a proof from an agent that offers a TPM and from
	// any key claiming an identity bound to an EK; an agent without a TPM enrolls as
	// with mac-uuid-serial.
	IdentityTPMOrFallback IdentityMode = "tpm-or-fallback"
)

// usesTPM reports whether the mode checks TPM attestation.
func (m IdentityMode) usesTPM() bool { return m == IdentityTPM || m == IdentityTPMOrFallback }

// Bounds on TPM attestation: sizes of what an agent sends, how long a challenge
// waits for its answer, and how many challenges wait at once (each costs a few hundred
// bytes; unauthenticated callers can make them, one per key).
const (
	maxTPMPublic        = 1024
	maxEKCertificate    = 4096
	maxTPMSecret        = 64
	maxChallengeID      = 64
	tpmChallengeTTL     = time.Minute
	maxPendingTPMChecks = 4096
	tpmSecretSize       = 32
)

// attestation is a checked TpmAttestation.
type attestation struct {
	// EKHash names the EK: "sha256:" + hex of the sha256 over its DER
	// SubjectPublicKeyInfo.
	EKHash string
	// EKCert is the EK certificate (DER) when the agent sent one whose key is the EK.
	EKCert []byte
	ek     tpm2.LabeledEncapsulationKey
	// AKName is the TPM name of the attestation key (nameAlg || digest of its public
	// area): what the credential is made for.
	AKName []byte
}

// parseAttestation checks what an agent sent about its TPM (untrusted input): the EK
// is a restricted decryption key that stays in its TPM, the AK a restricted signing key
// that was generated in and never leaves its TPM, the creation data parses, and an EK
// certificate, when sent and readable, certifies the EK. Errors say what is wrong.
func parseAttestation(p *bootv1.TpmAttestation) (*attestation, error) {
	if len(p.GetEkPublic()) == 0 || len(p.GetAkPublic()) == 0 {
		return nil, errors.New("tpm: ek_public and ak_public are required")
	}
	if len(p.GetEkPublic()) > maxTPMPublic || len(p.GetAkPublic()) > maxTPMPublic || len(p.GetAkCreationData()) > maxTPMPublic {
		return nil, fmt.Errorf("tpm: ek_public, ak_public and ak_creation_data are at most %d bytes each", maxTPMPublic)
	}
	if len(p.GetEkCertificate()) > maxEKCertificate {
		return nil, fmt.Errorf("tpm: ek_certificate is %d bytes, at most %d", len(p.GetEkCertificate()), maxEKCertificate)
	}
	ekPub, err := unmarshalPublic(p.GetEkPublic())
	if err != nil {
		return nil, fmt.Errorf("tpm: ek_public is not a TPMT_PUBLIC: %w", err)
	}
	if a := ekPub.ObjectAttributes; !a.FixedTPM || !a.FixedParent || !a.Restricted || !a.Decrypt || a.SignEncrypt {
		return nil, errors.New("tpm: ek_public is not an endorsement key: it must be a restricted decryption key with fixedTPM and fixedParent (the TCG EK template)")
	}
	spki, err := publicKeyDER(ekPub)
	if err != nil {
		return nil, fmt.Errorf("tpm: ek_public: %w", err)
	}
	ek, err := tpm2.ImportEncapsulationKey(ekPub)
	if err != nil {
		return nil, fmt.Errorf("tpm: ek_public cannot protect a credential: %w", err)
	}
	sum := sha256.Sum256(spki)
	out := &attestation{EKHash: "sha256:" + hex.EncodeToString(sum[:]), ek: ek}

	akPub, err := unmarshalPublic(p.GetAkPublic())
	if err != nil {
		return nil, fmt.Errorf("tpm: ak_public is not a TPMT_PUBLIC: %w", err)
	}
	if a := akPub.ObjectAttributes; !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.Restricted || !a.SignEncrypt || a.Decrypt {
		return nil, errors.New("tpm: ak_public is not an attestation key: it must be a restricted signing key with fixedTPM, fixedParent and sensitiveDataOrigin")
	}
	if akPub.Type != tpm2.TPMAlgRSA && akPub.Type != tpm2.TPMAlgECC {
		return nil, fmt.Errorf("tpm: ak_public has key type %#x; want RSA or ECC", uint16(akPub.Type))
	}
	if _, err := publicKeyDER(akPub); err != nil {
		return nil, fmt.Errorf("tpm: ak_public: %w", err)
	}
	name, err := tpm2.ObjectName(akPub)
	if err != nil {
		return nil, fmt.Errorf("tpm: ak_public has no name: %w", err)
	}
	out.AKName = name.Buffer

	if cd := p.GetAkCreationData(); len(cd) > 0 {
		if _, err := tpm2.Unmarshal[tpm2.TPMSCreationData](cd); err != nil {
			return nil, fmt.Errorf("tpm: ak_creation_data is not a TPMS_CREATION_DATA: %w", err)
		}
	}
	if der := p.GetEkCertificate(); len(der) > 0 {
		// Certificates some vendors issue do not parse with Go's strict checks
		// (negative serials, for one); such a certificate is only recorded. One that
		// parses must certify this EK.
		if c, err := x509.ParseCertificate(der); err == nil {
			certKey, err := x509.MarshalPKIXPublicKey(c.PublicKey)
			if err != nil || !bytes.Equal(certKey, spki) {
				return nil, errors.New("tpm: ek_certificate certifies another key than ek_public")
			}
		}
		out.EKCert = append([]byte(nil), der...)
	}
	return out, nil
}

// unmarshalPublic decodes a TPMT_PUBLIC and refuses trailing bytes.
func unmarshalPublic(b []byte) (pub *tpm2.TPMTPublic, err error) {
	defer func() {
		// go-tpm's reflective decoder may panic on malformed input.
		if r := recover(); r != nil {
			pub, err = nil, fmt.Errorf("malformed: %v", r)
		}
	}()
	pub, err = tpm2.Unmarshal[tpm2.TPMTPublic](b)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(tpm2.Marshal(pub), b) {
		return nil, errors.New("trailing or non-canonical bytes")
	}
	return pub, nil
}

// publicKeyDER returns the DER SubjectPublicKeyInfo of an RSA (2048 to 4096 bits) or
// ECC (P-256, P-384) public area, checking that an ECC point is on its curve.
func publicKeyDER(p *tpm2.TPMTPublic) ([]byte, error) {
	switch p.Type {
	case tpm2.TPMAlgRSA:
		parms, err := p.Parameters.RSADetail()
		if err != nil {
			return nil, err
		}
		n, err := p.Unique.RSA()
		if err != nil {
			return nil, err
		}
		k, err := tpm2.RSAPub(parms, n)
		if err != nil {
			return nil, err
		}
		if bits := k.N.BitLen(); bits < 2048 || bits > 4096 || k.E < 3 || k.E%2 == 0 {
			return nil, fmt.Errorf("RSA key of %d bits with exponent %d; want 2048 to 4096 bits and an odd exponent", bits, k.E)
		}
		return x509.MarshalPKIXPublicKey(&rsa.PublicKey{N: k.N, E: k.E})
	case tpm2.TPMAlgECC:
		parms, err := p.Parameters.ECCDetail()
		if err != nil {
			return nil, err
		}
		if parms.CurveID != tpm2.TPMECCNistP256 && parms.CurveID != tpm2.TPMECCNistP384 {
			return nil, fmt.Errorf("ECC curve %#x; want NIST P-256 or P-384", uint16(parms.CurveID))
		}
		pt, err := p.Unique.ECC()
		if err != nil {
			return nil, err
		}
		k, err := tpm2.ECDHPub(parms, pt)
		if err != nil {
			return nil, fmt.Errorf("ECC point: %w", err)
		}
		return x509.MarshalPKIXPublicKey(k)
	}
	return nil, fmt.Errorf("key type %#x; want RSA or ECC", uint16(p.Type))
}

// Bounds on the open TPM challenges (issue 33). Anyone who reaches the TLS port can
// ask for one with public EK and AK parts (a software-made EK under trust on first use,
// a real TPM's certified EK, which is public, under ekRoots), so the table is shared
// out: an unbound EK holds at most maxChallengesPerEK, a source address (an IPv6 /64)
// at most maxChallengesPerSource, and challenges for EKs no machine is bound to at most
// strangerChallenges of the maxPendingTPMChecks. A challenge for an EK the inventory
// binds to the identity it claims (a known machine after a reboot, or a manifest row's
// ekHash) is never refused for room: when the table is full it takes the place of the
// oldest challenge, so filling the table only shortens how long a challenge waits (the
// table's size in calls, at the rate the source limiter lets through: at 5 calls/s
// from 100 sources, 8 s), and an agent answers within a second.
const (
	maxChallengesPerEK     = 4
	maxChallengesPerSource = 8
	strangerChallenges     = maxPendingTPMChecks * 3 / 4
)

// pendingTPM is a credential challenge waiting for its answer.
type pendingTPM struct {
	id      string
	secret  []byte
	ekHash  string
	akName  []byte
	expires time.Time
	// source is the caller's address (SourcePrefix); known is set when the EK is
	// bound to the identity the call claimed.
	source netip.Prefix
	known  bool
}

// tpmChallenges are the open challenges, one per enrollment key fingerprint, in two
// queues oldest first: for known EKs and for strangers. They live in memory: a
// gpuboot restart forgets them and the agent gets a new one.
type tpmChallenges struct {
	mu        sync.Mutex
	m         map[string]*list.Element // fingerprint → element of known or strangers, Value *challengeEntry
	known     list.List
	strangers list.List
	bySource  map[netip.Prefix]int
	byEK      map[string]int // strangers only
}

type challengeEntry struct {
	fp string
	p  pendingTPM
}

// errChallengeRoom is a refusal of put; the message says what is full.
type errChallengeRoom struct{ what string }

func (e errChallengeRoom) Error() string { return e.what }

// put stores p for the key fp, replacing an earlier one of fp. It refuses when p's
// source, p's EK (a stranger's) or the strangers' share holds too many unexpired
// challenges; a known EK's challenge is not refused for room (see strangerChallenges).
func (c *tpmChallenges) put(fp string, p pendingTPM, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*list.Element{}
		c.bySource = map[netip.Prefix]int{}
		c.byEK = map[string]int{}
	}
	if el, ok := c.m[fp]; ok {
		c.remove(el)
	}
	full := func() error {
		switch {
		case c.bySource[p.source] >= maxChallengesPerSource:
			return errChallengeRoom{fmt.Sprintf("%s holds %d open TPM challenges, the most one address may; answer them or try again in %s", p.source, maxChallengesPerSource, tpmChallengeTTL)}
		case !p.known && c.byEK[p.ekHash] >= maxChallengesPerEK:
			return errChallengeRoom{fmt.Sprintf("EK %s has %d open TPM challenges, the most an EK no machine is bound to may; answer one or try again in %s", short(p.ekHash), maxChallengesPerEK, tpmChallengeTTL)}
		case !p.known && c.strangers.Len() >= strangerChallenges:
			return errChallengeRoom{fmt.Sprintf("%d TPM challenges for EKs no machine is bound to are waiting for their answer; try again in %s", c.strangers.Len(), tpmChallengeTTL)}
		}
		return nil
	}
	if full() != nil || c.len() >= maxPendingTPMChecks {
		c.sweep(now)
	}
	if err := full(); err != nil {
		return err
	}
	if c.len() >= maxPendingTPMChecks {
		// Only a known EK's challenge, or a stranger's within the strangers' share,
		// gets here: it takes the place of the oldest challenge it may displace.
		oldest := c.known.Front()
		if p.known {
			// The older of the two queues' fronts; a stranger's on a tie.
			if s := c.strangers.Front(); s != nil && (oldest == nil || !oldest.Value.(*challengeEntry).p.expires.Before(s.Value.(*challengeEntry).p.expires)) {
				oldest = s
			}
		}
		if oldest == nil {
			return errChallengeRoom{fmt.Sprintf("%d TPM challenges are waiting for their answer; try again in %s", c.len(), tpmChallengeTTL)}
		}
		c.remove(oldest)
	}
	q := &c.strangers
	if p.known {
		q = &c.known
	} else {
		c.byEK[p.ekHash]++
	}
	c.bySource[p.source]++
	c.m[fp] = q.PushBack(&challengeEntry{fp: fp, p: p})
	return nil
}

// take removes and returns the challenge of key fp; ok is false when there is none or
// it expired.
func (c *tpmChallenges) take(fp string, now time.Time) (pendingTPM, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[fp]
	if !ok {
		return pendingTPM{}, false
	}
	p := el.Value.(*challengeEntry).p
	c.remove(el)
	if !now.Before(p.expires) {
		return pendingTPM{}, false
	}
	return p, true
}

func (c *tpmChallenges) len() int { return c.known.Len() + c.strangers.Len() }

// remove drops el from its queue and the counts.
func (c *tpmChallenges) remove(el *list.Element) {
	e := el.Value.(*challengeEntry)
	delete(c.m, e.fp)
	if e.p.known {
		c.known.Remove(el)
	} else {
		c.strangers.Remove(el)
		if c.byEK[e.p.ekHash]--; c.byEK[e.p.ekHash] <= 0 {
			delete(c.byEK, e.p.ekHash)
		}
	}
	if c.bySource[e.p.source]--; c.bySource[e.p.source] <= 0 {
		delete(c.bySource, e.p.source)
	}
}

// sweep drops expired challenges from the fronts of both queues (each is in order
// of expiry, since every challenge lives tpmChallengeTTL). The clock may step back: a
// sweep then stops at the first unexpired one.
func (c *tpmChallenges) sweep(now time.Time) {
	for _, q := range []*list.List{&c.known, &c.strangers} {
		for el := q.Front(); el != nil && !now.Before(el.Value.(*challengeEntry).p.expires); el = q.Front() {
			c.remove(el)
		}
	}
}

// SourcePrefix is how gpuboot counts a caller's address: IPv4 per address, IPv6 per
// /64 (one host usually holds a whole /64). An address it cannot read counts as the
// zero prefix, one source for all such callers.
func SourcePrefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}

// sourceOf is the SourcePrefix of the gRPC peer of ctx.
func sourceOf(ctx context.Context) netip.Prefix {
	ap, err := netip.ParseAddrPort(remoteOf(ctx))
	if err != nil {
		return netip.Prefix{}
	}
	return SourcePrefix(ap.Addr())
}

// proveTPM runs the TPM part of a Register from the key fp for identity id (decision
// 0650). It returns the EK the key has proved ("" when the mode does not use TPMs, or
// an agent without a TPM enrolls under tpm-or-fallback), or a response to send
// instead of registering (a new challenge), or a gRPC error.
//
// A key proves its EK once: the EK is stored with the key, and later calls signed by
// the key count as its TPM's. Until then nothing is stored for it.
func (s *Service) proveTPM(ctx context.Context, id identity.Identity, fp string, p *bootv1.TpmAttestation, now time.Time) (ek string, cert []byte, resp *bootv1.RegisterResponse, err error) {
	if !s.cfg.Identity.usesTPM() {
		return "", nil, nil, nil
	}
	var stored *inventory.Machine
	if m, err := s.store.Lookup(ctx, id.Key()); err == nil {
		stored = m
		if i := m.FindKey(fp); i >= 0 && m.Keys[i].EKHash != "" {
			return m.Keys[i].EKHash, m.Keys[i].EKCertificate, nil, nil
		}
	} else if !errors.Is(err, inventory.ErrNotFound) {
		return "", nil, nil, status.Errorf(codes.Internal, "register %s: %v", id.MAC, err)
	}
	if p == nil {
		if s.cfg.Identity == IdentityTPM {
			return "", nil, nil, status.Error(codes.FailedPrecondition,
				"register: gpuboot requires TPM attestation (identity: tpm) and this agent sent none: enable the machine's TPM 2.0 in its firmware so the agent finds /dev/tpmrm0, "+
					"or have an operator set identity: tpm-or-fallback in gpuboot.yaml")
		}
		return "", nil, nil, nil
	}
	a, err := parseAttestation(p)
	if err != nil {
		return "", nil, nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	if s.cfg.EKRoots != nil {
		root, err := s.cfg.EKRoots.Verify(a.EKCert, now)
		if err != nil {
			s.count("tpm-refused")
			s.log.Warn("TPM refused: its EK certificate does not chain to enrollment.ekRoots", "mac", id.MAC, "serial", id.Serial, "key", fp, "ek", a.EKHash, "error", err)
			return "", nil, nil, status.Errorf(codes.PermissionDenied, "register: tpm: %v; gpuboot accepts only TPMs certified by the vendors in enrollment.ekRoots", err)
		}
		s.log.Debug("EK certificate chains to a vendor root", "mac", id.MAC, "ek", a.EKHash, "root", root)
	}
	if ans := p.GetActivation(); ans != nil {
		if len(ans.GetSecret()) > maxTPMSecret || len(ans.GetChallengeId()) > maxChallengeID {
			return "", nil, nil, status.Errorf(codes.InvalidArgument, "register: tpm.activation: secret at most %d bytes, challenge_id at most %d", maxTPMSecret, maxChallengeID)
		}
		want, ok := s.tpm.take(fp, now)
		switch {
		case !ok || want.id != ans.GetChallengeId():
			s.count("tpm-refused")
			return "", nil, nil, status.Error(codes.FailedPrecondition,
				"register: tpm.activation answers no open challenge of this key (expired, answered before, or gpuboot restarted): register without an activation for a new challenge")
		case want.ekHash != a.EKHash || !bytes.Equal(want.akName, a.AKName):
			s.count("tpm-refused")
			return "", nil, nil, status.Error(codes.PermissionDenied, "register: tpm.activation comes with another EK or AK than the challenge was made for")
		case subtle.ConstantTimeCompare(want.secret, ans.GetSecret()) != 1:
			s.count("tpm-refused")
			s.log.Warn("wrong TPM activation answer: the agent's TPM does not hold the EK it claims", "mac", id.MAC, "serial", id.Serial, "key", fp, "ek", a.EKHash)
			return "", nil, nil, status.Error(codes.PermissionDenied,
				"register: tpm.activation secret is wrong: this TPM does not hold the EK and AK it sent; register without an activation for a new challenge")
		}
		return a.EKHash, a.EKCert, nil, nil
	}
	secret := randomBytes(tpmSecretSize)
	blob, enc, err := tpm2.CreateCredential(rand.Reader, a.ek, a.AKName, secret)
	if err != nil {
		return "", nil, nil, status.Errorf(codes.InvalidArgument, "register: tpm: cannot make a credential for this EK: %v", err)
	}
	ch := pendingTPM{id: base64.RawURLEncoding.EncodeToString(randomBytes(16)), secret: secret, ekHash: a.EKHash, akName: a.AKName, expires: now.Add(tpmChallengeTTL),
		source: sourceOf(ctx), known: (stored != nil && stored.EKHash == a.EKHash) || s.cfg.Policy.Decide(id).EKHash == a.EKHash}
	if err := s.tpm.put(fp, ch, now); err != nil {
		s.count("tpm-limited")
		return "", nil, nil, status.Errorf(codes.ResourceExhausted, "register: %v", err)
	}
	s.count("tpm-challenge")
	return "", nil, &bootv1.RegisterResponse{
		Status:       bootv1.RegisterStatus_REGISTER_STATUS_PENDING,
		Message:      "prove the TPM: answer tpm_challenge with TPM2_ActivateCredential in the next Register",
		RetryAfter:   durationpb.New(0),
		TpmChallenge: &bootv1.TpmChallenge{Id: ch.id, CredentialBlob: blob, EncryptedSecret: enc, Ttl: durationpb.New(tpmChallengeTTL)},
	}, nil
}

// ekStep applies a machine's EK binding to a Register call before the key rules of
// decision 0405 (decision 0651). The binding is m.EKHash, or, before one, the ekHash of
// the manifest row the identity matched. A key that proved that EK takes the identity
// over at once, with a new approval and the old key's certificates revoked: it is the
// same machine after a reboot. Any other key (another EK, or none under
// tpm-or-fallback) gets nothing and puts the machine in conflict for an operator; the
// bound key keeps working. It returns the response when it decides the call, nil when
// the usual rules go on.
func ekStep(m *inventory.Machine, call registerCall, d *registerDecision, move func(inventory.State, string, string)) *bootv1.RegisterResponse {
	want := m.EKHash
	if want == "" {
		want = call.Verdict.EKHash
	}
	key := call.Key
	fp := key.Fingerprint
	if want == "" {
		return nil
	}
	if key.EKHash == want {
		if m.BoundKey != "" && m.BoundKey != fp && m.State.Bound() {
			old := m.BoundKey
			d.Revoke = m.AgentCertSerials
			m.AgentCertSerials, m.Approval = nil, nil
			m.Keys = []inventory.Key{key}
			m.BoundKey = fp
			move(inventory.Approved, "policy:tpm-same-ek",
				fmt.Sprintf("new key %s proved the bound TPM EK %s; key %s retired", short(fp), short(want), short(old)))
		}
		return nil
	}
	claimed := key.EKHash
	if claimed == "" {
		claimed = "none"
	}
	if i := m.FindKey(fp); i >= 0 {
		m.Keys[i].LastSeen, m.Keys[i].Remote = call.Now.UTC(), key.Remote
	} else if len(m.Keys) < 3 {
		// Recorded so an operator sees the claimant (`gpuboot machines show`);
		// bounded, since anyone can make keys.
		m.Keys = append(m.Keys, key)
	}
	if m.State != inventory.Conflict && inventory.Allowed(m.State, inventory.Conflict) {
		m.Approval = nil
		move(inventory.Conflict, "gpuboot", fmt.Sprintf("key %s proved TPM EK %s, but this identity is bound to EK %s", short(fp), short(claimed), short(want)))
	}
	return &bootv1.RegisterResponse{
		Status: bootv1.RegisterStatus_REGISTER_STATUS_CONFLICT,
		Message: fmt.Sprintf("this identity is bound to TPM EK %s and this key proved EK %s; an operator must resolve the conflict (gpuboot machines resolve-conflict)",
			want, claimed),
		RetryAfter: durationpb.New(6 * DefaultPollEvery),
	}
}

// bindEK binds m to the EK its bound key proved, when m is not bound to one yet.
func bindEK(m *inventory.Machine) {
	if m.EKHash != "" || m.BoundKey == "" {
		return
	}
	if i := m.FindKey(m.BoundKey); i >= 0 && m.Keys[i].EKHash != "" {
		m.EKHash, m.EKCertificate = m.Keys[i].EKHash, m.Keys[i].EKCertificate
	}
}

package bootv1

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxClockSkew is how far RequestAuth.unix_time may be from the verifier's clock, either
// way (docs/contracts.md §2.6).
const MaxClockSkew = 2 * time.Minute

// ChallengeSize is the length in bytes of RegisterResponse.challenge.
const ChallengeSize = 32

// JoinBundleSignatureContext prefixes the bytes a GetJoinBundleRequest signature covers
// (docs/contracts.md §2.5). It ends with a NUL byte.
const JoinBundleSignatureContext = "gpurack-joinbundle-v1\x00"

// Errors VerifyRequest and VerifyJoinBundle wrap, so a server can tell them apart in
// logs. All of them mean the call is not authenticated.
var (
	ErrMissingAuth  = errors.New("request carries no auth")
	ErrClockSkew    = errors.New("request signed too far from the server's time")
	ErrBadSignature = errors.New("signature does not verify")
)

// AuthenticatedRequest is an Enrollment request with a RequestAuth field named auth:
// RegisterRequest, GetJoinBundleRequest, ReportCommissioningRequest, HeartbeatRequest.
type AuthenticatedRequest interface {
	proto.Message
	GetAuth() *RequestAuth
}

// RequestSigningPayload returns the bytes a RequestAuth signature covers
// (docs/contracts.md §2.6, documented on RequestAuth in enroll.proto):
//
//	fullMethod || sha256(req encoded deterministically with auth cleared) || unixTime
//
// fullMethod is the gRPC method name, e.g. EnrollmentService_Register_FullMethodName;
// unixTime is written as 8 bytes big-endian. req is not modified.
func RequestSigningPayload(fullMethod string, req AuthenticatedRequest, unixTime int64) ([]byte, error) {
	if fullMethod == "" {
		return nil, errors.New("signing payload: empty method name")
	}
	m := proto.Clone(req)
	fd, err := authField(m.ProtoReflect())
	if err != nil {
		return nil, err
	}
	m.ProtoReflect().Clear(fd)
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("signing payload for %s: encode request: %w", fullMethod, err)
	}
	sum := sha256.Sum256(body)
	p := make([]byte, 0, len(fullMethod)+len(sum)+8)
	p = append(p, fullMethod...)
	p = append(p, sum[:]...)
	return binary.BigEndian.AppendUint64(p, uint64(unixTime)), nil
}

// SignRequest signs req for fullMethod at time now with key, and sets req's auth field
// to the result (replacing any auth it had).
func SignRequest(key ed25519.PrivateKey, fullMethod string, req AuthenticatedRequest, now time.Time) error {
	if len(key) != ed25519.PrivateKeySize {
		return fmt.Errorf("sign %s: ed25519 private key is %d bytes, want %d", fullMethod, len(key), ed25519.PrivateKeySize)
	}
	unix := now.Unix()
	payload, err := RequestSigningPayload(fullMethod, req, unix)
	if err != nil {
		return err
	}
	auth := &RequestAuth{
		PublicKey: append([]byte(nil), key.Public().(ed25519.PublicKey)...),
		Signature: ed25519.Sign(key, payload),
		UnixTime:  unix,
	}
	r := req.ProtoReflect()
	fd, err := authField(r)
	if err != nil {
		return err
	}
	r.Set(fd, protoreflect.ValueOfMessage(auth.ProtoReflect()))
	return nil
}

// VerifyRequest checks req's auth for fullMethod against the time now: a well-formed
// key, a unix_time within MaxClockSkew of now, and a signature over
// RequestSigningPayload. It returns the public key the request is signed with; the
// caller decides whether that key may make the call (the registered or bound key).
func VerifyRequest(fullMethod string, req AuthenticatedRequest, now time.Time) (ed25519.PublicKey, error) {
	auth := req.GetAuth()
	if auth == nil {
		return nil, fmt.Errorf("%s: %w", fullMethod, ErrMissingAuth)
	}
	if n := len(auth.GetPublicKey()); n != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s: auth.public_key is %d bytes, want a raw %d-byte ed25519 key", fullMethod, n, ed25519.PublicKeySize)
	}
	if n := len(auth.GetSignature()); n != ed25519.SignatureSize {
		return nil, fmt.Errorf("%s: auth.signature is %d bytes, want %d", fullMethod, n, ed25519.SignatureSize)
	}
	signed := time.Unix(auth.GetUnixTime(), 0)
	if skew := now.Sub(signed); skew > MaxClockSkew || skew < -MaxClockSkew {
		return nil, fmt.Errorf("%s: signed at %s, %s from the server's clock (limit ±%s; check time sync on the machine): %w",
			fullMethod, signed.UTC().Format(time.RFC3339), skew.Round(time.Second), MaxClockSkew, ErrClockSkew)
	}
	payload, err := RequestSigningPayload(fullMethod, req, auth.GetUnixTime())
	if err != nil {
		return nil, err
	}
	pub := ed25519.PublicKey(append([]byte(nil), auth.GetPublicKey()...))
	if !ed25519.Verify(pub, payload, auth.GetSignature()) {
		return nil, fmt.Errorf("%s: auth by key %s: %w", fullMethod, KeyFingerprint(pub), ErrBadSignature)
	}
	return pub, nil
}

// JoinBundleSigningPayload returns the bytes a GetJoinBundleRequest signature covers
// (docs/contracts.md §2.5): JoinBundleSignatureContext || challenge || token.
func JoinBundleSigningPayload(challenge []byte, token string) []byte {
	p := make([]byte, 0, len(JoinBundleSignatureContext)+len(challenge)+len(token))
	p = append(p, JoinBundleSignatureContext...)
	p = append(p, challenge...)
	return append(p, token...)
}

// SignJoinBundle returns GetJoinBundleRequest.signature for the challenge and token of
// an APPROVED RegisterResponse.
func SignJoinBundle(key ed25519.PrivateKey, challenge []byte, token string) []byte {
	return ed25519.Sign(key, JoinBundleSigningPayload(challenge, token))
}

// VerifyJoinBundle checks a GetJoinBundleRequest signature made by pub (the key the
// approval bound) over the challenge gpuboot issued with token.
func VerifyJoinBundle(pub ed25519.PublicKey, challenge []byte, token string, signature []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("join bundle signature: public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	if len(challenge) != ChallengeSize {
		return fmt.Errorf("join bundle signature: challenge is %d bytes, want %d", len(challenge), ChallengeSize)
	}
	if !ed25519.Verify(pub, JoinBundleSigningPayload(challenge, token), signature) {
		return fmt.Errorf("join bundle signature by key %s: %w", KeyFingerprint(pub), ErrBadSignature)
	}
	return nil
}

// KeyFingerprint returns the fingerprint of an ed25519 public key in the form
// RegisteredKey.fingerprint, JoinBundle.agent_key_ref and the agent's
// EnrollmentStatus.key_fingerprint use: "sha256:" + lowercase hex of the sha256 over the
// key's DER SubjectPublicKeyInfo (the same form as the gpurack.enroll.ca pin). It
// returns "" for a key that is not 32 bytes.
func KeyFingerprint(pub ed25519.PublicKey) string {
	if len(pub) != ed25519.PublicKeySize {
		return ""
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// authField returns the descriptor of m's auth field.
func authField(m protoreflect.Message) (protoreflect.FieldDescriptor, error) {
	fd := m.Descriptor().Fields().ByName("auth")
	if fd == nil || fd.Message() == nil || fd.Message().FullName() != (&RequestAuth{}).ProtoReflect().Descriptor().FullName() || fd.IsList() {
		return nil, fmt.Errorf("%s has no auth field of type RequestAuth", m.Descriptor().FullName())
	}
	return fd, nil
}

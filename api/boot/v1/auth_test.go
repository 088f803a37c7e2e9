package bootv1_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// A fixed key, so a failure reproduces.
var testKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))

const method = bootv1.EnrollmentService_Register_FullMethodName

func testRequest() *bootv1.RegisterRequest {
	return &bootv1.RegisterRequest{
		Facts: &machinev1.MachineFacts{
			Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:12:34:07", Serial: "R1-07"},
			Hostname: "node",
		},
		PublicKey: testKey.Public().(ed25519.PublicKey),
	}
}

func TestRequestSigningPayloadLayout(t *testing.T) {
	req := testRequest()
	req.Auth = &bootv1.RequestAuth{UnixTime: 99} // cleared before hashing
	got, err := bootv1.RequestSigningPayload(method, req, 1700000000)
	if err != nil {
		t.Fatal(err)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(testRequest())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	want := append([]byte(method), sum[:]...)
	want = binary.BigEndian.AppendUint64(want, 1700000000)
	if !bytes.Equal(got, want) {
		t.Errorf("payload = %x\nwant      %x", got, want)
	}
	if req.GetAuth().GetUnixTime() != 99 {
		t.Errorf("RequestSigningPayload modified the request's auth")
	}
}

func TestVerifyRequest(t *testing.T) {
	now := time.Unix(1700000000, 0)
	signedAt := func(d time.Duration) *bootv1.RegisterRequest {
		r := testRequest()
		if err := bootv1.SignRequest(testKey, method, r, now.Add(d)); err != nil {
			t.Fatal(err)
		}
		return r
	}
	tests := []struct {
		name    string
		req     func() *bootv1.RegisterRequest
		method  string
		wantErr error // nil: verifies
		errText string
	}{
		{name: "fresh", req: func() *bootv1.RegisterRequest { return signedAt(0) }},
		{name: "2 min behind, at the limit", req: func() *bootv1.RegisterRequest { return signedAt(-2 * time.Minute) }},
		{name: "2 min ahead, at the limit", req: func() *bootv1.RegisterRequest { return signedAt(2 * time.Minute) }},
		{name: "too old", req: func() *bootv1.RegisterRequest { return signedAt(-121 * time.Second) }, wantErr: bootv1.ErrClockSkew, errText: "time sync"},
		{name: "from the future", req: func() *bootv1.RegisterRequest { return signedAt(3 * time.Minute) }, wantErr: bootv1.ErrClockSkew},
		{name: "other method", req: func() *bootv1.RegisterRequest { return signedAt(0) }, method: bootv1.EnrollmentService_Heartbeat_FullMethodName, wantErr: bootv1.ErrBadSignature},
		{name: "body changed", req: func() *bootv1.RegisterRequest {
			r := signedAt(0)
			r.Facts.Hostname = "other"
			return r
		}, wantErr: bootv1.ErrBadSignature},
		{name: "timestamp changed", req: func() *bootv1.RegisterRequest {
			r := signedAt(0)
			r.Auth.UnixTime++
			return r
		}, wantErr: bootv1.ErrBadSignature},
		{name: "no auth", req: testRequest, wantErr: bootv1.ErrMissingAuth},
		{name: "short key", req: func() *bootv1.RegisterRequest {
			r := signedAt(0)
			r.Auth.PublicKey = r.Auth.PublicKey[:31]
			return r
		}, errText: "want a raw 32-byte ed25519 key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.method
			if m == "" {
				m = method
			}
			pub, err := bootv1.VerifyRequest(m, tt.req(), now)
			if tt.wantErr == nil && tt.errText == "" {
				if err != nil {
					t.Fatalf("VerifyRequest: %v", err)
				}
				if !pub.Equal(testKey.Public()) {
					t.Errorf("returned key %x, want the signer's", pub)
				}
				return
			}
			if err == nil {
				t.Fatalf("VerifyRequest succeeded, want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("err = %q, want it to mention %q", err, tt.errText)
			}
		})
	}
}

// The evolution rule documented on RequestAuth: a newer agent may send a field the
// server does not know, numbered above the existing ones, and the server, which
// re-encodes with that field as unknown, still verifies the signature.
func TestVerifyRequestWithFieldUnknownToServer(t *testing.T) {
	// A "newer" RegisterRequest: the current descriptor plus field 17.
	fdp := protodesc.ToFileDescriptorProto(bootv1.File_api_boot_v1_enroll_proto)
	for _, m := range fdp.MessageType {
		if m.GetName() == "RegisterRequest" {
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{
				Name:     proto.String("rack_hint"),
				JsonName: proto.String("rackHint"),
				Number:   proto.Int32(17),
				Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:     descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
			})
		}
	}
	// Resolve it against its imports only, not against the current enroll.proto.
	deps := new(protoregistry.Files)
	for _, path := range fdp.GetDependency() {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := deps.RegisterFile(fd); err != nil {
			t.Fatal(err)
		}
	}
	file, err := protodesc.NewFile(fdp, deps)
	if err != nil {
		t.Fatalf("build newer descriptor: %v", err)
	}
	md := file.Messages().ByName("RegisterRequest")
	newer := dynamicpb.NewMessage(md)
	old := testRequest()
	old.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		newer.Set(md.Fields().ByNumber(fd.Number()), v)
		return true
	})
	newer.Set(md.Fields().ByName("rack_hint"), protoreflect.ValueOfString("r9"))

	// The newer agent signs its own encoding (auth unset), then sends it with auth.
	now := time.Unix(1700000000, 0)
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(newer)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	payload := binary.BigEndian.AppendUint64(append([]byte(method), sum[:]...), uint64(now.Unix()))
	auth := &bootv1.RequestAuth{PublicKey: testKey.Public().(ed25519.PublicKey), Signature: ed25519.Sign(testKey, payload), UnixTime: now.Unix()}
	authMsg := dynamicpb.NewMessage(md.Fields().ByName("auth").Message())
	if err := proto.Unmarshal(mustMarshal(t, auth), authMsg); err != nil {
		t.Fatal(err)
	}
	newer.Set(md.Fields().ByName("auth"), protoreflect.ValueOfMessage(authMsg))
	wire := mustMarshal(t, newer)

	// The current server decodes it (field 17 unknown) and verifies.
	got := &bootv1.RegisterRequest{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatal(err)
	}
	if len(got.ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("field 17 should be unknown to the current RegisterRequest")
	}
	if _, err := bootv1.VerifyRequest(method, got, now); err != nil {
		t.Errorf("server could not verify a request with a newer field: %v", err)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestJoinBundleSignature(t *testing.T) {
	challenge := bytes.Repeat([]byte{0xab}, bootv1.ChallengeSize)
	payload := bootv1.JoinBundleSigningPayload(challenge, "tok")
	want := append(append([]byte("gpurack-joinbundle-v1\x00"), challenge...), "tok"...)
	if !bytes.Equal(payload, want) || len(bootv1.JoinBundleSignatureContext) != 22 {
		t.Fatalf("payload = %q, want %q", payload, want)
	}
	pub := testKey.Public().(ed25519.PublicKey)
	sig := bootv1.SignJoinBundle(testKey, challenge, "tok")
	if err := bootv1.VerifyJoinBundle(pub, challenge, "tok", sig); err != nil {
		t.Errorf("VerifyJoinBundle: %v", err)
	}
	if err := bootv1.VerifyJoinBundle(pub, challenge, "tok2", sig); !errors.Is(err, bootv1.ErrBadSignature) {
		t.Errorf("other token: err = %v, want ErrBadSignature", err)
	}
	other := bytes.Repeat([]byte{0xcd}, bootv1.ChallengeSize)
	if err := bootv1.VerifyJoinBundle(pub, other, "tok", sig); !errors.Is(err, bootv1.ErrBadSignature) {
		t.Errorf("other challenge: err = %v, want ErrBadSignature", err)
	}
	if err := bootv1.VerifyJoinBundle(pub, challenge[:16], "tok", sig); err == nil {
		t.Errorf("16-byte challenge accepted")
	}
}

func TestKeyFingerprint(t *testing.T) {
	pub := testKey.Public().(ed25519.PublicKey)
	fp := bootv1.KeyFingerprint(pub)
	// DER SubjectPublicKeyInfo of an ed25519 key: a fixed 12-byte prefix, then the key
	// (RFC 8410 §4).
	spki := append([]byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}, pub...)
	sum := sha256.Sum256(spki)
	if want := "sha256:" + strings.ToLower(hexString(sum[:])); fp != want {
		t.Errorf("KeyFingerprint = %s, want %s", fp, want)
	}
	if bootv1.KeyFingerprint(pub[:31]) != "" {
		t.Errorf("KeyFingerprint of a 31-byte key is not empty")
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	s := make([]byte, 0, 2*len(b))
	for _, c := range b {
		s = append(s, digits[c>>4], digits[c&15])
	}
	return string(s)
}

// TestRequestSignatureFixedVector pins the signed bytes and the signature of one request
// to values recorded once: agents and gpuboot of different versions must agree on them,
// so a change to the field order, the encoding or the payload layout fails here even
// when signing and verifying change together.
func TestRequestSignatureFixedVector(t *testing.T) {
	const (
		wantPayload   = "2f6770757261636b2e626f6f742e76312e456e726f6c6c6d656e74536572766963652f5265676973746572ea287638d038f75755c5244572836048df58e95a2c3d7331b330ff0f4e5b96d5000000006553f100"
		wantSignature = "e200e5bd6b2cee1bf8be9ede9872c3d22e02564de404836cfbfc585a8e4920fd1d23cf60ff1b21e036b5b93df7c1f75a4dd5950cabb55a6b120616792eb24f0b"
	)
	req := testRequest()
	req.Facts.Gpus = []*machinev1.GPU{{Index: 1, Uuid: "GPU-1"}, {Index: 0, Uuid: "GPU-0"}}
	req.Facts.Ips = []string{"10.0.0.17", "fd00::17"}
	payload, err := bootv1.RequestSigningPayload(method, req, 1700000000)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(payload); got != wantPayload {
		t.Errorf("signing payload changed:\n got %s\nwant %s", got, wantPayload)
	}
	if err := bootv1.SignRequest(testKey, method, req, time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(req.GetAuth().GetSignature()); got != wantSignature {
		t.Errorf("signature changed:\n got %s\nwant %s", got, wantSignature)
	}
	if _, err := bootv1.VerifyRequest(method, req, time.Unix(1700000060, 0)); err != nil {
		t.Errorf("the fixed vector does not verify: %v", err)
	}
}

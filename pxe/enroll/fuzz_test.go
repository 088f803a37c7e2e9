package enroll

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// fuzzService is a Service without a network listener: the fuzz targets call the
// handlers directly with decoded messages, the way gRPC would.
func fuzzService(f *testing.F) (*Service, ed25519.PrivateKey) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "fuzz CA"})
	if err != nil {
		f.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(f.TempDir(), "inventory.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close() })
	svc, err := New(context.Background(), Config{
		Store: store, CA: ca, Policy: policy.Policy{Mode: policy.Auto},
		Racks:       map[string]Rack{"r1": {Name: "r1", GossipKey: make([]byte, 32)}},
		DefaultRack: "r1", MaxUnapproved: 100, CreateRate: 1e6, CreateBurst: 1e6,
	})
	if err != nil {
		f.Fatal(err)
	}
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	return svc, key
}

// FuzzRegister feeds arbitrary RegisterRequest encodings to Register, once as they are
// (exercising request authentication) and once re-signed by a valid key (exercising
// identity parsing, the lifecycle and the answer). It must never panic, and whatever it
// answers, the stored history stays a path through the lifecycle table.
func FuzzRegister(f *testing.F) {
	svc, key := fuzzService(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(bootv1.RegisterRequest)
		if proto.Unmarshal(data, req) != nil {
			return
		}
		ctx := context.Background()
		svc.Register(ctx, proto.Clone(req).(*bootv1.RegisterRequest))
		req.PublicKey = key.Public().(ed25519.PublicKey)
		if bootv1.SignRequest(key, bootv1.EnrollmentService_Register_FullMethodName, req, time.Now()) != nil {
			return
		}
		resp, err := svc.Register(ctx, req)
		if err == nil && resp.Status == bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
			b, err := svc.GetJoinBundle(ctx, signedBundleRequest(key, resp.Token, resp.Challenge))
			if err == nil && b.GetBundle().GetAgentKeyRef() != bootv1.KeyFingerprint(key.Public().(ed25519.PublicKey)) {
				t.Fatal("bundle for another key")
			}
		}
		checkAllHistories(t, svc)
	})
}

// FuzzGetJoinBundle feeds arbitrary GetJoinBundleRequest encodings, raw and re-signed.
// No bundle may come out: nothing was approved.
func FuzzGetJoinBundle(f *testing.F) {
	svc, key := fuzzService(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(bootv1.GetJoinBundleRequest)
		if proto.Unmarshal(data, req) != nil {
			return
		}
		ctx := context.Background()
		if _, err := svc.GetJoinBundle(ctx, proto.Clone(req).(*bootv1.GetJoinBundleRequest)); err == nil {
			t.Fatal("bundle released for a fuzzed request")
		}
		if bootv1.SignRequest(key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now()) != nil {
			return
		}
		if _, err := svc.GetJoinBundle(ctx, req); err == nil {
			t.Fatal("bundle released for a fuzzed request")
		}
	})
}

// FuzzReportAndHeartbeat feeds arbitrary ReportCommissioningRequest and
// HeartbeatRequest encodings, raw and re-signed.
func FuzzReportAndHeartbeat(f *testing.F) {
	svc, key := fuzzService(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		rep := new(bootv1.ReportCommissioningRequest)
		if proto.Unmarshal(data, rep) == nil {
			svc.ReportCommissioning(ctx, proto.Clone(rep).(*bootv1.ReportCommissioningRequest))
			if bootv1.SignRequest(key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, rep, time.Now()) == nil {
				svc.ReportCommissioning(ctx, rep)
			}
		}
		hb := new(bootv1.HeartbeatRequest)
		if proto.Unmarshal(data, hb) == nil {
			svc.Heartbeat(ctx, proto.Clone(hb).(*bootv1.HeartbeatRequest))
			if bootv1.SignRequest(key, bootv1.EnrollmentService_Heartbeat_FullMethodName, hb, time.Now()) == nil {
				svc.Heartbeat(ctx, hb)
			}
		}
		checkAllHistories(t, svc)
	})
}

func signedBundleRequest(key ed25519.PrivateKey, token string, challenge []byte) *bootv1.GetJoinBundleRequest {
	req := &bootv1.GetJoinBundleRequest{Token: token, Signature: bootv1.SignJoinBundle(key, challenge, token)}
	bootv1.SignRequest(key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	return req
}

func checkAllHistories(t *testing.T, svc *Service) {
	t.Helper()
	ctx := context.Background()
	all, err := svc.store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		h, err := svc.store.History(ctx, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := inventory.CheckHistory(h, m.State); err != nil {
			t.Fatalf("machine %s: %v", m.ID, err)
		}
	}
}

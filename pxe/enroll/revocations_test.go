package enroll

import (
	"context"
	"slices"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// TestHeartbeatCarriesRevocations: a heartbeat over mutual TLS that reports another
// revocation list than gpuboot's gets gpuboot's list (an agent's API then refuses the
// revoked certificates); one that reports the current list, or a key-signed one, gets
// none.
func TestHeartbeatCarriesRevocations(t *testing.T) {
	e := newEnv(t, nil)
	a, mtls, node := joined(e, "52:54:00:00:00:81")
	serial := "1f2e3d"
	if _, err := e.svc.RevokeSerials([]string{serial}); err != nil {
		t.Fatal(err)
	}
	hb := func(digest string) *bootv1.HeartbeatResponse {
		t.Helper()
		resp, err := mtls.Heartbeat(context.Background(), &bootv1.HeartbeatRequest{Identity: a.facts.Identity, NodeName: node,
			Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY}, RevocationsDigest: digest})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	held := pki.NewRevocationList()
	resp := hb(held.Digest())
	if !slices.Contains(resp.GetRevocations().GetSerials(), serial) {
		t.Fatalf("an agent holding an empty list got %v; want gpuboot's list with %s", resp.GetRevocations(), serial)
	}
	if err := held.Replace(resp.GetRevocations().GetSerials()); err != nil {
		t.Fatal(err)
	}
	if resp := hb(held.Digest()); resp.GetRevocations() != nil {
		t.Fatalf("an agent holding the current list got it again: %v", resp.GetRevocations())
	}
	if resp, err := a.heartbeat(a.c, true); err != nil || resp.GetRevocations() != nil {
		t.Fatalf("key-signed heartbeat: %v, revocations %v; want none", err, resp.GetRevocations())
	}
	if _, err := e.svc.RevokeSerials([]string{"not-hex"}); err == nil {
		t.Fatal("a serial that is not hex was accepted")
	}
}

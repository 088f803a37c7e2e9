package server_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// TestGossipRotateCLI runs `gpuboot gossip rotate --wait` and `gossip status` against a
// real `gpuboot serve`: a rack with no live agent has nobody to wait for, so the
// rotation goes through installing and retiring to a new key, which the key file on
// disk then holds; an agent certificate cannot start one.
func TestGossipRotateCLI(t *testing.T) {
	in := newInstance(t, "")
	in.start()
	keyFile := filepath.Join(in.dir, "state", "gossip", "r1.key")
	before, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if out := in.cli("gossip", "status", "r1"); !strings.Contains(out, "rack r1: steady, encrypting with key ") {
		t.Fatalf("status before:\n%s", out)
	}
	out := in.cli("gossip", "rotate", "r1", "--wait", "60s")
	for _, want := range []string{"rack r1: installing", "rack r1: retiring", "rack r1: steady"} {
		if !strings.Contains(out, want) {
			t.Fatalf("rotate output lacks %q:\n%s", want, out)
		}
	}
	after, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := enroll.ParseGossipRing(after)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := enroll.ParseGossipRing(before)
	if bytes.Equal(ring.Primary, old.Primary) || ring.Phase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY {
		t.Fatalf("key file after the rotation: phase %s, same key %v", ring.Phase(), bytes.Equal(ring.Primary, old.Primary))
	}
	if out := in.cli("gossip", "status", "r1", "--json"); !strings.Contains(out, bootv1.GossipKeyFingerprint(ring.Primary)) {
		t.Fatalf("status --json does not name the new key's fingerprint:\n%s", out)
	}
	// An unknown rack is a clear error.
	cmd := exec.Command(in.bin, "gossip", "rotate", "r9", "--server", in.tlsAddr, "--credentials", in.creds)
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), `no rack "r9"`) {
		t.Fatalf("rotate of an unknown rack: %v\n%s", err, b)
	}
}

package protoconv

import (
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// TestStateRoundTrip: every lifecycle state has its own enum value and converts back;
// None is UNSPECIFIED.
func TestStateRoundTrip(t *testing.T) {
	seen := map[bootv1.MachineState]inventory.State{}
	for _, s := range inventory.States {
		p := StateProto(s)
		if p == bootv1.MachineState_MACHINE_STATE_UNSPECIFIED {
			t.Errorf("state %s has no protobuf enum value", s)
		}
		if other, dup := seen[p]; dup {
			t.Errorf("states %s and %s both convert to %v", other, s, p)
		}
		seen[p] = s
		if back := StateFromProto(p); back != s {
			t.Errorf("%s → %v → %s", s, p, back)
		}
	}
	if got := StateFromProto(bootv1.MachineState_MACHINE_STATE_UNSPECIFIED); got != inventory.None {
		t.Errorf("UNSPECIFIED → %q, want None", got)
	}
}

// TestIdentityFromProto normalises and refuses what pxe/identity refuses.
func TestIdentityFromProto(t *testing.T) {
	id, err := IdentityFromProto(&machinev1.MachineIdentity{BootMac: "AA-BB-CC-DD-EE-01", Serial: "S1"})
	if err != nil || id.MAC != "aa:bb:cc:dd:ee:01" || id.Serial != "S1" {
		t.Fatalf("identity %+v, %v", id, err)
	}
	if p := IdentityProto(id); p.GetBootMac() != id.MAC || p.GetSerial() != "S1" {
		t.Errorf("back: %v", p)
	}
	for _, bad := range []*machinev1.MachineIdentity{nil, {}, {BootMac: "not a mac"}} {
		if _, err := IdentityFromProto(bad); err == nil {
			t.Errorf("IdentityFromProto(%v): no error", bad)
		}
	}
}

func TestPhaseWord(t *testing.T) {
	for p, want := range map[bootv1.GossipRotationPhase]string{
		bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_STEADY:     "steady",
		bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING: "installing",
		bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING:   "retiring",
	} {
		if got := PhaseWord(p); got != want {
			t.Errorf("PhaseWord(%v) = %q, want %q", p, got, want)
		}
	}
}

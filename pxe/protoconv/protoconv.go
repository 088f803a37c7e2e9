// Package protoconv converts gpuboot's domain values to and from their api/ protobuf
// forms (CONTRACTS §1, §2): a machine identity, a lifecycle state, and the words the
// operator surfaces print for enums (a gossip rotation phase). It is pure and small so
// that the operator side (pxe/admin, the gpuboot CLI) converts without importing the
// enrollment engine.
//
// It decides nothing; pxe/identity normalises identities and pxe/inventory owns the
// states.
package protoconv

import (
	"errors"
	"fmt"
	"strings"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// IdentityFromProto normalises a MachineIdentity (CONTRACTS §1). The boot MAC is
// required.
func IdentityFromProto(p *machinev1.MachineIdentity) (identity.Identity, error) {
	if p == nil {
		return identity.Identity{}, errors.New("identity is missing")
	}
	id, err := identity.New(p.GetBootMac(), p.GetSmbiosUuid(), p.GetSerial())
	if err != nil {
		return identity.Identity{}, fmt.Errorf("identity: %w", err)
	}
	return id, nil
}

// IdentityProto converts back.
func IdentityProto(id identity.Identity) *machinev1.MachineIdentity {
	return &machinev1.MachineIdentity{BootMac: id.MAC, SmbiosUuid: id.UUID, Serial: id.Serial}
}

// StateProto converts a lifecycle state to its protobuf enum.
func StateProto(s inventory.State) bootv1.MachineState {
	if v, ok := bootv1.MachineState_value["MACHINE_STATE_"+strings.ToUpper(string(s))]; ok {
		return bootv1.MachineState(v)
	}
	return bootv1.MachineState_MACHINE_STATE_UNSPECIFIED
}

// StateFromProto converts back; UNSPECIFIED is None.
func StateFromProto(s bootv1.MachineState) inventory.State {
	if s == bootv1.MachineState_MACHINE_STATE_UNSPECIFIED {
		return inventory.None
	}
	return inventory.State(strings.ToLower(strings.TrimPrefix(s.String(), "MACHINE_STATE_")))
}

// PhaseWord is a gossip rotation phase's text form: "steady", "installing", "retiring".
func PhaseWord(p bootv1.GossipRotationPhase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "GOSSIP_ROTATION_PHASE_"))
}

// WipeProto is a pending data-disk wipe as heartbeat answers and Machine carry it; nil
// for none.
func WipeProto(w *inventory.DataDiskWipe) *machinev1.DataDiskWipe {
	if w == nil {
		return nil
	}
	return &machinev1.DataDiskWipe{Id: w.ID, Path: w.Path, Serial: w.Serial}
}

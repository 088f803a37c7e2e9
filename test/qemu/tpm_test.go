//go:build linux

package qemu

import (
	"regexp"
	"slices"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestTPMIdentityInQEMU (make e2e, GPURACK_E2E_TPM=1) is the TPM-bound identity
// (decisions 0650, 0651) on real machines: the tiny image boots in QEMU with a TPM 2.0 (swtpm as QEMU's TPM emulator
// backend, a tpm-tis device; the Debian kernel's built-in driver gives /dev/tpmrm0),
// against `gpuboot serve` with `identity: tpm` and `reenroll: manual`.
//
//  1. Machine A powers on with TPM A; its agent proves the EK by credential activation
//     and waits; an operator approves it, which binds the EK; the agent takes its bundle.
//  2. A is powered off and on (the same TPM state, a new agent key): it re-enrolls with
//     no operator (actor policy:tpm-same-ek), although reenroll is manual.
//  3. Machine B, another VM with the same MAC, UUID and serial but its own TPM, powers
//     on: the machine goes to conflict, B gets no bundle, and A's key stays bound.
//
// No control plane: the bundles carry no Kubernetes credentials, which this test does
// not need (TestTinyNodeJoin joins).
func TestTPMIdentityInQEMU(t *testing.T) {
	// Three boots of the tiny image, about 4 minutes: with it test/qemu passed go test's
	// package timeout and CI neared its 60 minutes on 2 cores, so it runs in make e2e.
	testreq.OptIn(t, "GPURACK_E2E_TPM", "three QEMU boots with swtpm, about 4 minutes (make e2e runs it)")
	testreq.Tool(t, "swtpm", "apt-get install swtpm swtpm-tools (make deps installs it)")
	machine := MachineSpec{Node: joinNode, MAC: joinMAC, IP: poweronNodeIP, Serial: joinSerial, UUID: joinUUID}
	r := startRack(t, RackOptions{Machines: []MachineSpec{machine}, NoControlPlane: true, NoPowerOn: true,
		Enrollment: "{unknownMachines: discover, identity: tpm, reenroll: manual}"})
	g, ctx := r.g, r.ctx
	tpmA, tpmB := t.TempDir(), t.TempDir()
	approved := regexp.MustCompile(`gpuagent: approved; fetching the JoinBundle \(gpuboot ` + regexp.QuoteMeta(joinTLS) + `, key (sha256:[0-9a-f]{64})\)`)
	powerOn := func(name, tpm string) *RackMachine {
		spec := machine
		spec.Node, spec.TPMDir = name, tpm
		return r.powerOn(t, spec)
	}

	// 1. First power-on of A: the EK proof, an operator's approval, the bundle.
	a1 := powerOn("machine-A", tpmA)
	key1 := a1.con.waitFor(t, waitingLine, bootToWaitLimit)[1]
	t.Logf("machine A waits for approval after %s with key %s", a1.con.since().Round(time.Second), key1)
	var mach *bootv1.Machine
	waitFor(t, ctx, time.Minute, "gpuboot holds A's key with its proved EK", func() bool {
		mach = g.machine(t, joinMAC)
		for _, k := range mach.GetKeys() {
			if k.GetFingerprint() == key1 && k.GetEkHash() != "" {
				return true
			}
		}
		return false
	})
	g.cli(t, "machines", "approve", joinMAC, "--reason", "TestTPMIdentityInQEMU")
	a1.con.waitFor(t, approved, approveToNode)
	mach = g.machine(t, joinMAC)
	ekA := mach.GetEkHash()
	if ekA == "" || mach.GetKeyFingerprint() != key1 {
		t.Fatalf("after the approval: EK bound %q, bound key %s (want A's EK and key %s)", ekA, mach.GetKeyFingerprint(), key1)
	}
	t.Logf("A approved by an operator: EK %s bound", ekA)
	a1.powerOff()

	// 2. A again: the same TPM, a new key, no operator.
	a2 := powerOn("machine-A-rebooted", tpmA)
	key2 := a2.con.waitFor(t, approved, bootToWaitLimit)[1]
	if key2 == key1 {
		t.Fatalf("the rebooted agent used its old key %s: the key should be new each boot", key1)
	}
	mach = g.machine(t, joinMAC)
	if mach.GetKeyFingerprint() != key2 || mach.GetEkHash() != ekA {
		t.Fatalf("after A's reboot: bound key %s EK %s, want %s and %s", mach.GetKeyFingerprint(), mach.GetEkHash(), key2, ekA)
	}
	if !slices.ContainsFunc(mach.GetHistory(), func(tr *bootv1.Transition) bool {
		return tr.GetActor() == "policy:tpm-same-ek" && tr.GetTo() == bootv1.MachineState_MACHINE_STATE_APPROVED
	}) {
		t.Fatalf("no approval by policy:tpm-same-ek in the history: %v", mach.GetHistory())
	}
	t.Logf("A rebooted re-enrolled without an operator after %s (policy:tpm-same-ek)", a2.con.since().Round(time.Second))
	a2.powerOff()

	// 3. B: the same MAC, UUID and serial, another TPM.
	b := powerOn("machine-B-forged", tpmB)
	waitFor(t, ctx, bootToWaitLimit, "the machine goes to conflict when B registers", func() bool {
		mach = g.machine(t, joinMAC)
		return mach.GetState() == bootv1.MachineState_MACHINE_STATE_CONFLICT
	}, b.con.tail)
	if mach.GetKeyFingerprint() != key2 || mach.GetEkHash() != ekA {
		t.Errorf("during the conflict: bound key %s EK %s, want A's %s and %s", mach.GetKeyFingerprint(), mach.GetEkHash(), key2, ekA)
	}
	// gpuboot answers B's agent CONFLICT, which ends its enrollment (only an operator
	// changes that: agent/enroll ErrStopped). Its console says so: from then on it asks
	// for no bundle, so a console without "approved" at that point is the answer.
	b.con.waitFor(t, regexp.MustCompile(`gpuagent: another live key claims this identity`), time.Minute)
	if slices.ContainsFunc(b.con.snapshot(), approved.MatchString) {
		t.Errorf("machine B, with another TPM, was approved:\n%s", b.con.tail())
	}
	t.Logf("B (another TPM) got conflict and no bundle; A's key and EK stay bound")
}

// snapshot is what the console showed so far.
func (c *serialConsole) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}

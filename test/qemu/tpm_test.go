//go:build linux

package qemu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/netnstest"
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
	testreq.Tool(t, "qemu-system-x86_64", "apt-get install qemu-system-x86 (make deps installs it)")
	testreq.Tool(t, "swtpm", "apt-get install swtpm swtpm-tools (make deps installs it)")
	bins, imageDir, pubKey := joinImage(t)
	imageID := filepath.Base(imageDir)

	env := netnstest.New(t)
	ns := env.Namespace()
	env.AddAddr(netnstest.Link{Name: "lo", Netns: ns}, joinHost+"/32")
	env.AddAddr(netnstest.Link{Name: "lo", Netns: ns}, joinGuestIP+"/32")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	g := startNamespacedGpuboot(t, env, ns, bins.gpuboot, "", filepath.Dir(imageDir), pubKey, imageID,
		gpubootSettings{enrollment: "{unknownMachines: discover, identity: tpm, reenroll: manual}"})
	kernel, initrd, cmdline := g.bootScript(t, ctx)
	cmdline += " gpurack.onfail=poweroff"
	if os.Getenv("GPURACK_JOIN_JOURNAL") == "1" {
		cmdline += " systemd.journald.forward_to_console=1"
	}
	tpmA, tpmB := t.TempDir(), t.TempDir()
	approved := regexp.MustCompile(`gpuagent: approved; fetching the JoinBundle \(gpuboot ` + regexp.QuoteMeta(joinTLS) + `, key (sha256:[0-9a-f]{64})\)`)

	// 1. First power-on of A: the EK proof, an operator's approval, the bundle.
	a1 := powerOnWithTPM(t, ns, "machine A", tpmA, kernel, initrd, cmdline)
	key1 := a1.con.waitFor(t, regexp.MustCompile(`gpuagent: waiting for approval \(gpuboot `+regexp.QuoteMeta(joinTLS)+`, key (sha256:[0-9a-f]{64})\)`), bootToWaitLimit)[1]
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
	a1.powerOff(t)

	// 2. A again: the same TPM, a new key, no operator.
	a2 := powerOnWithTPM(t, ns, "machine A, rebooted", tpmA, kernel, initrd, cmdline)
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
	a2.powerOff(t)

	// 3. B: the same MAC, UUID and serial, another TPM.
	b := powerOnWithTPM(t, ns, "machine B (forged identity)", tpmB, kernel, initrd, cmdline)
	waitFor(t, ctx, bootToWaitLimit, "the machine goes to conflict when B registers", func() bool {
		mach = g.machine(t, joinMAC)
		return mach.GetState() == bootv1.MachineState_MACHINE_STATE_CONFLICT
	}, b.con.tail)
	if mach.GetKeyFingerprint() != key2 || mach.GetEkHash() != ekA {
		t.Errorf("during the conflict: bound key %s EK %s, want A's %s and %s", mach.GetKeyFingerprint(), mach.GetEkHash(), key2, ekA)
	}
	// B keeps polling; give it time to be wrongly approved before looking.
	time.Sleep(20 * time.Second)
	if slices.ContainsFunc(b.con.snapshot(), approved.MatchString) {
		t.Errorf("machine B, with another TPM, was approved:\n%s", b.con.tail())
	}
	t.Logf("B (another TPM) got conflict and no bundle; A's key and EK stay bound")
}

// tpmMachine is a QEMU machine with its TPM.
type tpmMachine struct {
	con  *serialConsole
	qemu *exec.Cmd
	tpm  *exec.Cmd
}

// powerOnWithTPM starts swtpm on the TPM state folder dir (the same folder is the same
// TPM) and QEMU with it as a tpm-tis device, booting the tiny image directly.
func powerOnWithTPM(t *testing.T, ns, name, dir, kernel, initrd, cmdline string) *tpmMachine {
	t.Helper()
	sock := filepath.Join(dir, "ctrl.sock")
	os.Remove(sock)
	tpm := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+dir, "--ctrl", "type=unixio,path="+sock, "--terminate")
	tpm.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &syncBuffer{}
	tpm.Stdout, tpm.Stderr = out, out
	if err := tpm.Start(); err != nil {
		t.Fatalf("start swtpm: %v", err)
	}
	exited := make(chan struct{})
	go func() { tpm.Wait(); close(exited) }()
	t.Cleanup(func() { tpm.Process.Kill(); <-exited })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("swtpm made no control socket %s in 10 s: %s", sock, out.String())
		}
	}
	qemu := joinQEMU(ns, kernel, initrd, cmdline,
		"-chardev", "socket,id=chrtpm,path="+sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
	t.Logf("%s: power on (TPM state %s)", name, dir)
	return &tpmMachine{con: startNamedConsole(t, qemu, name), qemu: qemu, tpm: tpm}
}

// powerOff kills QEMU and its TPM, as pulling the plug does.
func (m *tpmMachine) powerOff(t *testing.T) {
	t.Helper()
	m.qemu.Process.Kill()
	<-m.con.done
	m.tpm.Process.Kill()
}

// snapshot is what the console showed so far.
func (c *serialConsole) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}

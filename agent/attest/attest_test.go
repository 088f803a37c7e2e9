package attest_test

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/gpurack/gpurack/agent/attest"
	"github.com/gpurack/gpurack/agent/attest/attesttest"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/swtpmtest"
)

// challenge makes a credential for att's EK and AK the way gpuboot does.
func challenge(t *testing.T, att *bootv1.TpmAttestation, secret []byte) *bootv1.TpmChallenge {
	t.Helper()
	ek, err := tpm2.Unmarshal[tpm2.TPMTPublic](att.EkPublic)
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tpm2.Unmarshal[tpm2.TPMTPublic](att.AkPublic)
	if err != nil {
		t.Fatal(err)
	}
	key, err := tpm2.ImportEncapsulationKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	name, err := tpm2.ObjectName(ak)
	if err != nil {
		t.Fatal(err)
	}
	blob, enc, err := tpm2.CreateCredential(rand.Reader, key, name.Buffer, secret)
	if err != nil {
		t.Fatal(err)
	}
	return &bootv1.TpmChallenge{Id: "c1", CredentialBlob: blob, EncryptedSecret: enc}
}

// A real software TPM answers a credential made for its own EK and AK, keeps the same
// EK and AK across a restart (a reboot), and cannot answer one made for another TPM.
func TestActivateWithSWTPM(t *testing.T) {
	a := swtpmtest.Start(t)
	att := attesttest.New(t, a)
	got := att.Attestation()
	if len(got.EkPublic) == 0 || len(got.AkPublic) == 0 || len(got.AkCreationData) == 0 {
		t.Fatalf("attestation incomplete: %d EK, %d AK, %d creation data bytes", len(got.EkPublic), len(got.AkPublic), len(got.AkCreationData))
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	ans, err := att.Activate(challenge(t, got, secret))
	if err != nil {
		t.Fatal(err)
	}
	if ans.ChallengeId != "c1" || !bytes.Equal(ans.Secret, secret) {
		t.Fatalf("activation = %q %x, want c1 %x", ans.ChallengeId, ans.Secret, secret)
	}

	// The same TPM after a restart: same EK and AK.
	if err := att.Close(); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	again := attesttest.New(t, swtpmtest.StartIn(t, a.Dir)).Attestation()
	if !bytes.Equal(again.EkPublic, got.EkPublic) || !bytes.Equal(again.AkPublic, got.AkPublic) {
		t.Fatal("the restarted TPM has another EK or AK")
	}

	// Another TPM cannot recover a secret made for this one.
	other := attesttest.New(t, swtpmtest.Start(t))
	if bytes.Equal(other.Attestation().EkPublic, got.EkPublic) {
		t.Fatal("two swtpm instances share an EK")
	}
	if _, err := other.Activate(challenge(t, got, secret)); err == nil {
		t.Fatal("another TPM activated a credential made for this TPM's EK")
	} else {
		t.Logf("other TPM: %v", err)
	}
}

// Open on paths that do not exist says there is no TPM.
func TestOpenNoTPM(t *testing.T) {
	_, err := attest.Open(t.TempDir() + "/tpmrm0")
	if err == nil || !bytesContains(err.Error(), "no TPM 2.0 device") {
		t.Fatalf("Open = %v, want the no-TPM error", err)
	}
}

func bytesContains(s, sub string) bool { return bytes.Contains([]byte(s), []byte(sub)) }

// A machine whose power is cut (a BMC's ForceOff or PowerCycle, a pulled plug) never
// sends TPM2_Shutdown. A TPM counts an unorderly shutdown after a use of an object that
// is subject to dictionary-attack protection as a failed authorization, and after
// maxTries of them (3 in swtpm's default, 32 or so on vendors' TPMs) it refuses such
// objects for recoveryTime: an AK without noDA then cannot answer gpuboot's challenge,
// and the machine cannot re-enroll after its fourth power cut. The AK is noDA, so the
// challenge is answered after every one of them.
func TestActivateAfterPowerCuts(t *testing.T) {
	tpm := swtpmtest.Start(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	for boot := 1; boot <= 6; boot++ {
		att, err := attest.New(tpm.Dial(t))
		if err != nil {
			t.Fatalf("boot %d: %v", boot, err)
		}
		ans, err := att.Activate(challenge(t, att.Attestation(), secret))
		if err != nil {
			t.Fatalf("boot %d, after %d power cuts: activate: %v", boot, boot-1, err)
		}
		if !bytes.Equal(ans.Secret, secret) {
			t.Fatalf("boot %d: activation recovered %x, want %x", boot, ans.Secret, secret)
		}
		tpm.Stop() // the power cut: no TPM2_Shutdown, no flush
		tpm = swtpmtest.StartIn(t, tpm.Dir)
	}
}

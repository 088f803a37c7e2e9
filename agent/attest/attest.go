// Package attest proves to gpuboot that the agent runs on the machine whose TPM 2.0
// holds a given Endorsement Key (decision 0650): it creates the EK and an attestation
// key (AK) in the TPM, hands their public parts to enrollment, and answers gpuboot's
// credential challenge with TPM2_ActivateCredential, which a TPM completes only when
// both keys are loaded in it.
//
// It talks to a TPM through go-tpm's transport: the kernel's resource manager
// (/dev/tpmrm0) or the raw device (/dev/tpm0) on a node, or in tests swtpm's server
// socket (internal/swtpmtest's Stream). It is not the enrollment client (agent/enroll
// calls it) and decides nothing: gpuboot checks the answer.
package attest

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// DevicePaths are where Open looks for a TPM, in order: the kernel's resource manager
// first (several users may share it), then the raw device.
var DevicePaths = []string{"/dev/tpmrm0", "/dev/tpm0"}

// ErrNoTPM is returned by Open when none of the device paths exists.
var ErrNoTPM = errors.New("no TPM 2.0 device")

// Open opens the first TPM device of paths (DevicePaths when none are given). It wraps
// ErrNoTPM when none exists, so a caller can tell a machine without a TPM from a TPM
// it cannot use.
func Open(paths ...string) (transport.TPMCloser, error) {
	if len(paths) == 0 {
		paths = DevicePaths
	}
	for _, p := range paths {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		t, err := linuxtpm.Open(p)
		if err != nil {
			return nil, fmt.Errorf("attest: open TPM %s: %w (the agent runs as root; is the tpm_crb or tpm_tis module loaded?)", p, err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("attest: %w: none of %v exists (enable the TPM in the firmware setup, or use identity: mac-uuid-serial or tpm-or-fallback in gpuboot.yaml)", ErrNoTPM, paths)
}

// EK certificate NV indices (TCG EK Credential Profile 2.0, §2.2.1.4): RSA-2048 and
// ECC-P256 low range.
const (
	ekCertIndexRSA = 0x01C00002
	ekCertIndexECC = 0x01C0000A
)

// akTemplate is the attestation key: an ECC-P256 ECDSA-SHA256 signing key that is
// restricted (it signs only TPM-generated structures) and never leaves the TPM
// (fixedTPM, fixedParent, sensitiveDataOrigin). gpuboot checks these attributes. It is
// noDA: its authorization is the empty password, so dictionary-attack protection guards
// nothing, and without noDA every power cut (no TPM2_Shutdown) after a use of the AK
// counts as a failed try: after maxTries of them (3 in swtpm, about 32 on vendors' TPMs)
// the TPM locks the AK out and the machine cannot re-enroll (TestActivateAfterPowerCuts).
var akTemplate = tpm2.TPMTPublic{
	Type:    tpm2.TPMAlgECC,
	NameAlg: tpm2.TPMAlgSHA256,
	ObjectAttributes: tpm2.TPMAObject{
		FixedTPM:            true,
		FixedParent:         true,
		SensitiveDataOrigin: true,
		UserWithAuth:        true,
		NoDA:                true,
		Restricted:          true,
		SignEncrypt:         true,
	},
	Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		Scheme: tpm2.TPMTECCScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
		},
		CurveID: tpm2.TPMECCNistP256,
	}),
	Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
		Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)},
	}),
}

// Attester holds a TPM's EK and AK loaded and answers challenges. Both are primary
// keys derived from the TPM's seeds, so they are the same after every reboot. It is
// safe for concurrent use.
type Attester struct {
	mu     sync.Mutex
	tpm    transport.TPM
	ek, ak tpm2.NamedHandle
	att    *bootv1.TpmAttestation
}

// New creates the EK (the TCG default RSA-2048 template, the one vendors certify) and
// the AK in tpm and reads the EK certificate when the TPM holds one. Close flushes the
// keys; it does not close tpm.
func New(tpm transport.TPM) (*Attester, error) {
	ek, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(tpm2.RSAEKTemplate)}.Execute(tpm)
	if err != nil {
		return nil, fmt.Errorf("attest: create the endorsement key: %w", err)
	}
	a := &Attester{tpm: tpm, ek: tpm2.NamedHandle{Handle: ek.ObjectHandle, Name: ek.Name}}
	ak, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(akTemplate)}.Execute(tpm)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("attest: create the attestation key: %w", err)
	}
	a.ak = tpm2.NamedHandle{Handle: ak.ObjectHandle, Name: ak.Name}
	ekPub, err := ek.OutPublic.Contents()
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("attest: endorsement key public area: %w", err)
	}
	akPub, err := ak.OutPublic.Contents()
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("attest: attestation key public area: %w", err)
	}
	cd, err := ak.CreationData.Contents()
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("attest: attestation key creation data: %w", err)
	}
	a.att = &bootv1.TpmAttestation{
		EkPublic:       tpm2.Marshal(ekPub),
		EkCertificate:  readEKCert(tpm),
		AkPublic:       tpm2.Marshal(akPub),
		AkCreationData: tpm2.Marshal(cd),
	}
	return a, nil
}

// readEKCert returns the EK certificate from the TPM's NV storage, or nil when there
// is none or it is not a certificate: many TPMs (and swtpm without --create-ek-cert)
// have none, and gpuboot then binds the key itself.
func readEKCert(tpm transport.TPM) []byte {
	for _, idx := range []tpm2.TPMHandle{ekCertIndexRSA, ekCertIndexECC} {
		pub, err := tpm2.NVReadPublic{NVIndex: idx}.Execute(tpm)
		if err != nil {
			continue
		}
		nv, err := pub.NVPublic.Contents()
		if err != nil || nv.DataSize == 0 || nv.DataSize > 4096 {
			continue
		}
		var der []byte
		for off := uint16(0); off < nv.DataSize; {
			n := min(nv.DataSize-off, 512)
			r, err := tpm2.NVRead{
				AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
				NVIndex:    tpm2.NamedHandle{Handle: idx, Name: pub.NVName},
				Size:       n,
				Offset:     off,
			}.Execute(tpm)
			if err != nil {
				der = nil
				break
			}
			der = append(der, r.Data.Buffer...)
			off += n
		}
		// Some vendors pad the index; keep only the DER certificate.
		if c, err := x509.ParseCertificate(trimDER(der)); err == nil {
			return c.Raw
		}
	}
	return nil
}

// trimDER cuts b after its first DER element (padding some TPMs store after it).
func trimDER(b []byte) []byte {
	var v asn1.RawValue
	if _, err := asn1.Unmarshal(b, &v); err != nil {
		return b
	}
	return v.FullBytes
}

// Attestation returns a copy of what Register carries about the TPM, without an
// activation.
func (a *Attester) Attestation() *bootv1.TpmAttestation {
	return &bootv1.TpmAttestation{
		EkPublic: a.att.EkPublic, EkCertificate: a.att.EkCertificate,
		AkPublic: a.att.AkPublic, AkCreationData: a.att.AkCreationData,
	}
}

// Activate recovers the secret of gpuboot's challenge with TPM2_ActivateCredential.
func (a *Attester) Activate(ch *bootv1.TpmChallenge) (*bootv1.TpmActivation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := tpm2.ActivateCredential{
		ActivateHandle: a.ak,
		KeyHandle: tpm2.AuthHandle{
			Handle: a.ek.Handle, Name: a.ek.Name,
			// The default EK's policy: PolicySecret with the endorsement hierarchy.
			Auth: tpm2.Policy(tpm2.TPMAlgSHA256, 16, func(t transport.TPM, s tpm2.TPMISHPolicy, nonce tpm2.TPM2BNonce) error {
				_, err := tpm2.PolicySecret{AuthHandle: tpm2.TPMRHEndorsement, PolicySession: s, NonceTPM: nonce}.Execute(t)
				return err
			}),
		},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: ch.GetCredentialBlob()},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: ch.GetEncryptedSecret()},
	}.Execute(a.tpm)
	if errors.Is(err, tpm2.TPMRCLockout) {
		return nil, fmt.Errorf("attest: activate gpuboot's credential %q: %w: the TPM is in dictionary-attack lockout (power cuts without a TPM shutdown count as failed tries); it leaves lockout after its recoveryTime, or clear it with the lockout authorization (tpm2_dictionarylockout --clear-lockout)", ch.GetId(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("attest: activate gpuboot's credential %q: %w (the challenge was made for another EK or AK)", ch.GetId(), err)
	}
	return &bootv1.TpmActivation{ChallengeId: ch.GetId(), Secret: r.CertInfo.Buffer}, nil
}

// Close flushes the keys from the TPM.
func (a *Attester) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for _, h := range []tpm2.NamedHandle{a.ak, a.ek} {
		if h.Handle != 0 {
			if _, err := (tpm2.FlushContext{FlushHandle: h.Handle}).Execute(a.tpm); err != nil {
				errs = append(errs, err)
			}
		}
	}
	a.ak, a.ek = tpm2.NamedHandle{}, tpm2.NamedHandle{}
	return errors.Join(errs...)
}

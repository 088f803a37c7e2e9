package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// eccPublic returns a TPMT_PUBLIC for a fresh P-256 key with attributes attrs, and the
// key.
func eccPublic(t testing.TB, attrs tpm2.TPMAObject, restrictedDecrypt bool) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	parms := &tpm2.TPMSECCParms{CurveID: tpm2.TPMECCNistP256}
	if restrictedDecrypt {
		parms.Symmetric = tpm2.TPMTSymDefObject{
			Algorithm: tpm2.TPMAlgAES,
			KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(128)),
			Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
		}
	} else {
		parms.Scheme = tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256})}
	}
	pub := tpm2.TPMTPublic{
		Type: tpm2.TPMAlgECC, NameAlg: tpm2.TPMAlgSHA256, ObjectAttributes: attrs,
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, parms),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: k.X.FillBytes(make([]byte, 32))},
			Y: tpm2.TPM2BECCParameter{Buffer: k.Y.FillBytes(make([]byte, 32))},
		}),
	}
	return tpm2.Marshal(&pub), k
}

var (
	ekAttrs = tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, AdminWithPolicy: true, Restricted: true, Decrypt: true}
	akAttrs = tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, UserWithAuth: true, Restricted: true, SignEncrypt: true}
)

// sampleAttestation is a well-formed attestation of software keys (what a TPM would
// send, without the TPM) and the EK's private key.
func sampleAttestation(t testing.TB) (*bootv1.TpmAttestation, *ecdsa.PrivateKey) {
	ek, ekKey := eccPublic(t, ekAttrs, true)
	ak, _ := eccPublic(t, akAttrs, false)
	return &bootv1.TpmAttestation{EkPublic: ek, AkPublic: ak}, ekKey
}

// certFor returns a self-signed certificate for key's public key.
func certFor(t testing.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "EK"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// parseAttestation accepts a restricted-decrypt EK and a restricted signing AK and
// refuses everything that would let a credential be made for a key outside a TPM.
func TestParseAttestation(t *testing.T) {
	good, ekKey := sampleAttestation(t)
	a, err := parseAttestation(good)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.EKHash, "sha256:") || len(a.EKHash) != 71 || len(a.AKName) != 34 {
		t.Fatalf("EK hash %q, AK name %d bytes", a.EKHash, len(a.AKName))
	}
	withCert := &bootv1.TpmAttestation{EkPublic: good.EkPublic, AkPublic: good.AkPublic, EkCertificate: certFor(t, ekKey)}
	if a, err := parseAttestation(withCert); err != nil || len(a.EKCert) == 0 {
		t.Fatalf("EK with its certificate: %v", err)
	}

	other, otherKey := sampleAttestation(t)
	exportable := akAttrs
	exportable.FixedTPM = false
	unrestricted := akAttrs
	unrestricted.Restricted = false
	ekSigns := ekAttrs
	ekSigns.Decrypt, ekSigns.SignEncrypt = false, true
	badAK, _ := eccPublic(t, exportable, false)
	openAK, _ := eccPublic(t, unrestricted, false)
	signEK, _ := eccPublic(t, ekSigns, true)
	for _, c := range []struct {
		name string
		p    *bootv1.TpmAttestation
		want string
	}{
		{"no EK", &bootv1.TpmAttestation{AkPublic: good.AkPublic}, "required"},
		{"AK may leave the TPM", &bootv1.TpmAttestation{EkPublic: good.EkPublic, AkPublic: badAK}, "not an attestation key"},
		{"AK signs anything", &bootv1.TpmAttestation{EkPublic: good.EkPublic, AkPublic: openAK}, "not an attestation key"},
		{"EK is a signing key", &bootv1.TpmAttestation{EkPublic: signEK, AkPublic: good.AkPublic}, "not an endorsement key"},
		{"trailing bytes", &bootv1.TpmAttestation{EkPublic: append(append([]byte(nil), good.EkPublic...), 0), AkPublic: good.AkPublic}, "trailing"},
		{"certificate of another key", &bootv1.TpmAttestation{EkPublic: good.EkPublic, AkPublic: good.AkPublic, EkCertificate: certFor(t, otherKey)}, "another key"},
		{"creation data garbage", &bootv1.TpmAttestation{EkPublic: other.EkPublic, AkPublic: other.AkPublic, AkCreationData: []byte{0, 1}}, "TPMS_CREATION_DATA"},
		{"oversized", &bootv1.TpmAttestation{EkPublic: make([]byte, maxTPMPublic+1), AkPublic: good.AkPublic}, "at most"},
	} {
		if _, err := parseAttestation(c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// FuzzParseAttestation: what an agent sends about its TPM is untrusted. Parsing must
// never panic, and whatever it accepts yields an EK hash of the documented form, an AK
// name, and a credential can be made for it.
func FuzzParseAttestation(f *testing.F) {
	good, ekKey := sampleAttestation(f)
	f.Add(good.EkPublic, good.AkPublic, []byte(nil), certFor(f, ekKey))
	f.Add(good.EkPublic, good.AkPublic, []byte{0, 0}, []byte(nil))
	f.Add(tpm2.Marshal(&tpm2.RSAEKTemplate), tpm2.Marshal(&tpm2.RSASRKTemplate), []byte(nil), []byte{0x30, 0x03, 0x02, 0x01, 0x01})
	f.Fuzz(func(t *testing.T, ek, ak, creation, cert []byte) {
		a, err := parseAttestation(&bootv1.TpmAttestation{EkPublic: ek, AkPublic: ak, AkCreationData: creation, EkCertificate: cert})
		if err != nil {
			return
		}
		if !strings.HasPrefix(a.EKHash, "sha256:") || len(a.EKHash) != 71 || len(a.AKName) < 2 {
			t.Fatalf("accepted with EK hash %q and AK name %x", a.EKHash, a.AKName)
		}
		if _, _, err := tpm2.CreateCredential(rand.Reader, a.ek, a.AKName, make([]byte, tpmSecretSize)); err != nil {
			t.Fatalf("accepted an EK no credential can be made for: %v", err)
		}
	})
}

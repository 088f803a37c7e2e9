package enroll

import (
	"context"
	"encoding/pem"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpurack/gpurack/agent/attest/attesttest"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/swtpmtest"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// TestManifestEKDefeatsStranger performs issue 33's attack 5 under `approval:
// allowlist` with `identity: tpm`: the manifest names each machine's EK, one row by
// ekHash, one by the vendor's EK certificate. A stranger who knows a listed serial, MAC
// and UUID registers before the machine, proving its own (software) TPM: refused,
// nothing stored, no token. Then the machine with the named TPM is approved by its row
// and receives its bundle.
func TestManifestEKDefeatsStranger(t *testing.T) {
	tpmA := attesttest.New(t, swtpmtest.Start(t))
	certified := attesttest.New(t, swtpmtest.NewVendor(t).StartCertified(t))
	der := certified.Attestation().GetEkCertificate()
	if len(der) == 0 {
		t.Fatal("the certified swtpm sent no EK certificate")
	}
	certPEM := strings.ReplaceAll(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), `"`, `""`)
	csv := "serial,mac,ekHash,ekCertificate\n" +
		"SN-MEK-1,52:54:00:00:0e:01," + ekHashOf(t, tpmA) + ",\n" +
		"SN-MEK-2,52:54:00:00:0e:02,,\"" + certPEM + "\"\n"
	list, err := policy.ParseListBytes("manifest.csv", []byte(csv))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Identity = IdentityTPM
		c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
	})
	for _, c := range []struct{ mac, serial string }{
		{"52:54:00:00:0e:01", "SN-MEK-1"},
		{"52:54:00:00:0e:02", "SN-MEK-2"},
	} {
		real := e.agent(c.mac, c.serial)
		stranger := withTPM(real.rebooted(), attesttest.New(t, swtpmtest.Start(t)))
		_, err := stranger.prove()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "rack manifest") {
			t.Fatalf("%s: the stranger's proven Register: %v; want PermissionDenied naming the manifest", c.serial, err)
		}
		id, _ := identity.New(c.mac, real.facts.Identity.SmbiosUuid, c.serial)
		if _, err := e.store.Lookup(context.Background(), id.Key()); !errors.Is(err, inventory.ErrNotFound) {
			t.Fatalf("%s: the stranger's Register stored a record (%v)", c.serial, err)
		}
		tpm := tpmA
		if c.serial == "SN-MEK-2" {
			tpm = certified
		}
		r := withTPM(real, tpm).mustProve(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
		b, err := real.bundle(r.Token, r.Challenge)
		if err != nil || b.GetNodeName() == "" {
			t.Fatalf("%s: the machine with the named TPM: bundle %v, %v", c.serial, b, err)
		}
		if m := e.machine(c.mac); m.EKHash != ekHashOf(t, tpm) || m.State != inventory.Joining {
			t.Fatalf("%s: %s bound to EK %s; want joining, bound to the manifest's EK", c.serial, m.State, short(m.EKHash))
		}
		e.checkHistory(c.mac)
	}
}

// Under `identity: mac-uuid-serial` nothing proves an EK, so a row that names one
// approves nobody, at boot or at Register: the machine waits for an operator, and the
// answer says which setting makes the row work.
func TestManifestEKWithoutTPMIdentityApprovesNobody(t *testing.T) {
	csv := "serial,mac,ekHash\nSN-MEK-3,52:54:00:00:0e:03,sha256:" + strings.Repeat("ab", 32) + "\n"
	list, err := policy.ParseListBytes("manifest.csv", []byte(csv))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Policy = policy.Policy{Mode: policy.Allowlist, List: list} })
	a := e.agent("52:54:00:00:0e:03", "SN-MEK-3")
	id, _ := protoconv.IdentityFromProto(a.facts.Identity)
	if d, err := e.svc.DecideBoot(context.Background(), id, netip.MustParseAddr("192.0.2.30")); err != nil || e.machine("52:54:00:00:0e:03").State != inventory.Discovered {
		t.Fatalf("boot request: %+v, %v; want the machine discovered, not approved", d, err)
	}
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if r.Token != "" || !strings.Contains(r.Message, "enrollment.identity: tpm") {
		t.Fatalf("answer %q; want one naming enrollment.identity: tpm", r.Message)
	}
}

package enroll

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// TestAllowlistOfSeveralRacks: with one manifest per rack (policy.allowlist a list),
// each rack's rows approve its machines, the transition record names the row by file
// and line, and a row is held by file and line: a machine holding line 2 of
// rack-r1.csv does not hold line 2 of rack-r2.csv.
func TestAllowlistOfSeveralRacks(t *testing.T) {
	dir := t.TempDir()
	r1, r2 := filepath.Join(dir, "rack-r1.csv"), filepath.Join(dir, "rack-r2.csv")
	// Line 2 of each: a serial-only row in r1, a MAC-only row in r2.
	for p, csv := range map[string]string{
		r1: "serial,rack,slot\nSN-R1-01,r1,U01\n",
		r2: "mac,rack,slot\n52:54:00:00:0e:01,r2,U01\n52:54:00:00:0e:02,r2,U02\n",
	} {
		if err := os.WriteFile(p, []byte(csv), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list, err := policy.LoadLists(r1, r2)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
		c.Racks["r2"] = Rack{Name: "r2", DefaultImage: c.Racks["r1"].DefaultImage, GossipKey: make([]byte, 32)}
	})
	// Rack r1's machine boots with the NIC rack r2's line 2 lists: its serial matches
	// first, so it takes rack-r1.csv line 2.
	first := e.agent("52:54:00:00:0e:01", "SN-R1-01")
	first.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	// Another machine with that NIC and an unlisted serial matches rack-r2.csv line 2,
	// which nobody holds.
	second := e.agent("52:54:00:00:0e:01", "SN-R2-01")
	second.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	third := e.agent("52:54:00:00:0e:02", "SN-R2-02")
	third.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)

	for _, c := range []struct {
		a                 *agent
		rack, actor, from string
	}{
		{first, "r1", "policy:allowlist:rack-r1.csv:2", r1 + " line 2"},
		{second, "r2", "policy:allowlist:rack-r2.csv:2", r2 + " line 2"},
		{third, "r2", "policy:allowlist:rack-r2.csv:3", r2 + " line 3"},
	} {
		fid := c.a.facts.GetIdentity()
		id, err := identity.New(fid.GetBootMac(), fid.GetSmbiosUuid(), fid.GetSerial())
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.store.Lookup(context.Background(), id.Key())
		if err != nil {
			t.Fatal(err)
		}
		h, err := e.store.History(context.Background(), m.ID)
		if err != nil {
			t.Fatal(err)
		}
		last := h[len(h)-1]
		if m.State != inventory.Approved || m.Rack != c.rack || last.Actor != c.actor || last.Reason != "listed in the rack manifest "+c.from {
			t.Errorf("%s: %s in rack %s, approved by %q: %q; want rack %s, %q, %q", fid.GetSerial(), m.State, m.Rack, last.Actor, last.Reason, c.rack, c.actor, c.from)
		}
	}
}

// With several manifests, the start warnings name the files whose rows they are about.
func TestStartWarningsNameTheFiles(t *testing.T) {
	ek := "sha256:" + strings.Repeat("ab", 32)
	withEK, err := policy.ParseListBytes("rack-r1.csv", []byte("serial,ekHash\nS1,"+ek+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	withoutEK, err := policy.ParseListBytes("rack-r2.csv", []byte("serial\nS2\nS3\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := policy.MergeLists(withEK, withoutEK)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id   IdentityMode
		want string
	}{
		{IdentityTPM, "2 of the 3 rows of rack-r2.csv name no TPM EK"},
		{IdentityMACUUIDSerial, "the 1 rows of rack-r1.csv that name a TPM EK approve nobody"},
	}
	for _, c := range cases {
		w := StartWarnings(Config{Policy: policy.Policy{Mode: policy.Allowlist, List: l}, Identity: c.id, Reenroll: ReenrollManual})
		if len(w) != 1 || !strings.Contains(w[0], c.want) {
			t.Errorf("identity %s: warnings %q, want one with %q", c.id, w, c.want)
		}
	}
}

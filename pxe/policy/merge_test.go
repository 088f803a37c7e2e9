package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/pxe/identity"
)

// writeManifests writes each manifest into a fresh directory and returns the paths.
func writeManifests(t *testing.T, files map[string]string) (dir string) {
	t.Helper()
	dir = t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Two racks' manifests, as the vendor shipped them, merge into one list: every entry
// keeps its file and line, and a decision names the row by both.
func TestLoadListsMergesRacks(t *testing.T) {
	dir := writeManifests(t, map[string]string{
		"rack-r1.csv": "serial,mac,rack,slot\nSN-R1-01,52:54:00:00:01:01,r1,U01\nSN-R1-02,52:54:00:00:01:02,r1,U02\n",
		"rack-r2.csv": "# rack r2\nserial,mac,rack,slot,bmc\nSN-R2-01,52:54:00:00:02:01,r2,U01,https://10.0.2.1\n",
	})
	r1, r2 := filepath.Join(dir, "rack-r1.csv"), filepath.Join(dir, "rack-r2.csv")
	l, err := LoadLists(r1, r2)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) != 3 || strings.Join(l.Sources, "|") != r1+"|"+r2 || l.Source != r1+", "+r2 {
		t.Fatalf("merged list: %d entries, sources %q (%q)", len(l.Entries), l.Sources, l.Source)
	}
	p := Policy{Mode: Allowlist, List: l}
	d := p.Decide(identity.Identity{Serial: "SN-R2-01", MAC: "52:54:00:00:02:01"})
	if !d.Approve || d.Rack != "r2" || d.BMC != "https://10.0.2.1" || d.Source != r2 || d.Line != 3 ||
		d.Actor != "policy:allowlist:rack-r2.csv:3" || d.Reason != "listed in the rack manifest "+r2+" line 3" || !d.ByAllowlist() {
		t.Fatalf("decision for rack r2's row: %+v", d)
	}
	d1 := p.Decide(identity.Identity{Serial: "SN-R1-01", MAC: "52:54:00:00:01:01"})
	if d1.Source != r1 || d1.Line != 2 || d1.Actor != "policy:allowlist:rack-r1.csv:2" {
		t.Fatalf("decision for rack r1's row: %+v", d1)
	}
	// Line 3 of rack-r1.csv is not line 3 of rack-r2.csv.
	e, _ := l.Match(identity.Identity{Serial: "SN-R1-02", MAC: "52:54:00:00:01:02"})
	if e.Line != d.Line || d.MatchedRow(e) || !d.MatchedRow(l.Entries[2]) {
		t.Fatalf("MatchedRow: %+v against %+v", d, e)
	}
	// One file keeps the actor it always had.
	one, err := LoadLists(r1)
	if err != nil {
		t.Fatal(err)
	}
	if d := (Policy{Mode: Allowlist, List: one}).Decide(identity.Identity{Serial: "SN-R1-01", MAC: "52:54:00:00:01:01"}); d.Actor != "policy:allowlist:2" || d.Source != r1 {
		t.Fatalf("one file: %+v", d)
	}
}

// A machine listed in two manifests is an error naming both files and lines, every
// such row at once; so is a file given twice, and a file that does not parse.
func TestLoadListsErrors(t *testing.T) {
	ek := "sha256:" + strings.Repeat("ab", 32)
	dir := writeManifests(t, map[string]string{
		"rack-r1.csv": "serial,mac,ekHash\nSN1,52:54:00:00:01:01,\nSN2,52:54:00:00:01:02," + ek + "\nSN3,52:54:00:00:01:03,\n",
		"rack-r2.csv": "serial,mac\nSN1,52:54:00:00:02:01\nSN9,52:54:00:00:01:03\n",
		"bad.csv":     "serial,colour\nSN1,red\n",
		"r3-ek.csv":   "mac,ekHash\n52:54:00:00:03:01,sha256:" + strings.ToUpper(ek[7:]) + "\n",
	})
	at := func(name string) string { return filepath.Join(dir, name) }
	cases := []struct {
		paths []string
		want  []string
	}{
		{[]string{at("rack-r1.csv"), at("rack-r2.csv")}, []string{
			`allowlist ` + at("rack-r2.csv") + ` line 2: serial "SN1" already listed in ` + at("rack-r1.csv") + ` line 2`,
			`allowlist ` + at("rack-r2.csv") + ` line 3: mac 52:54:00:00:01:03 already listed in ` + at("rack-r1.csv") + ` line 4`,
		}},
		{[]string{at("rack-r1.csv"), at("r3-ek.csv")}, []string{
			`allowlist ` + at("r3-ek.csv") + ` line 2: ekHash ` + ek + ` already listed in ` + at("rack-r1.csv") + ` line 3: one TPM is in one machine`,
		}},
		{[]string{at("rack-r1.csv"), at("rack-r1.csv")}, []string{"allowlist " + at("rack-r1.csv") + " is given twice"}},
		{[]string{at("bad.csv"), at("missing.csv"), at("rack-r1.csv")}, []string{
			"allowlist " + at("bad.csv") + ` line 1: unknown column "colour"`, "missing.csv: no such file or directory"}},
		{nil, []string{"no manifest file given"}},
	}
	for _, c := range cases {
		_, err := LoadLists(c.paths...)
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("LoadLists(%q) = %v, want %q", c.paths, err, want)
			}
		}
	}
}

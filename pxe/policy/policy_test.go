package policy

import (
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/disksel"
	"github.com/gpurack/gpurack/pxe/identity"
)

const manifest = `# rack r1 manifest from the vendor
serial,mac,rack,slot
SN-0001,52:54:00:00:01:01,r1,U01
SN-0002,,r1,U02
,52-54-00-00-01-03,r1,U03
`

func TestParseListAndMatch(t *testing.T) {
	l, err := ParseListBytes("r1.csv", []byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) != 3 {
		t.Fatalf("%d entries, want 3", len(l.Entries))
	}
	cases := []struct {
		name string
		c    identity.Identity
		slot string
		ok   bool
	}{
		{"serial and mac match", identity.Identity{MAC: "52:54:00:00:01:01", Serial: "SN-0001"}, "U01", true},
		{"serial right, mac wrong: both listed so both must match", identity.Identity{MAC: "52:54:00:00:09:09", Serial: "SN-0001"}, "", false},
		{"serial only entry", identity.Identity{MAC: "52:54:00:00:09:09", Serial: "SN-0002"}, "U02", true},
		{"mac only entry, normalised", identity.Identity{MAC: "52:54:00:00:01:03", Serial: "whatever"}, "U03", true},
		{"unknown", identity.Identity{MAC: "52:54:00:00:09:09", Serial: "SN-9"}, "", false},
		{"empty candidate", identity.Identity{}, "", false},
	}
	for _, c := range cases {
		e, ok := l.Match(c.c)
		if ok != c.ok || e.Slot != c.slot {
			t.Errorf("%s: Match = %+v, %v; want slot %q, %v", c.name, e, ok, c.slot, c.ok)
		}
	}
}

func TestParseListErrors(t *testing.T) {
	cases := map[string]string{
		"":                                       "empty",
		"serial,color\nA,red\n":                  `unknown column "color"`,
		"rack,slot\nr1,U1\n":                     "no serial or mac column",
		"serial,mac\nSN1,zz:zz\n":                "line 2",
		"serial\nTo Be Filled By O.E.M.\n":       "placeholder",
		"serial\nSN1\nSN1\n":                     "already listed on line 2",
		"serial,mac\n,\n":                        "neither serial nor mac",
		"serial,mac,rack\nSN1,52:54:00:00:00:01": "3",
		"serial,ekHash\nSN1,sha256:abc\n":        "want sha256: and 64 hex digits",
		"serial,ekHash\nSN1,sha1:" + strings.Repeat("a", 64) + "\n":                                               "want sha256:",
		"serial,ekHash\nSN1,sha256:" + strings.Repeat("g", 64) + "\n":                                             "not hex",
		"serial,ekHash\nSN1,sha256:" + strings.Repeat("a", 64) + "\nSN2,SHA256:" + strings.Repeat("A", 64) + "\n": "one TPM is in one machine",
	}
	for in, want := range cases {
		_, err := ParseListBytes("m.csv", []byte(in))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "m.csv") {
			t.Errorf("ParseList(%q) err = %v, want one naming m.csv and containing %q", in, err, want)
		}
	}
}

// A bmc column is checked as a Redfish address and reaches the decision; a user or
// password in it is refused, since BMC accounts are never in the manifest.
func TestBMCColumn(t *testing.T) {
	l, err := ParseListBytes("m.csv", []byte("serial,bmc\nSN1,https://10.0.0.5/\nSN2,\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := (Policy{Mode: Manual, List: l}).Decide(identity.Identity{Serial: "SN1"}); d.BMC != "https://10.0.0.5" {
		t.Fatalf("decision %+v, want BMC https://10.0.0.5", d)
	}
	if d := (Policy{Mode: Manual, List: l}).Decide(identity.Identity{Serial: "SN2"}); d.BMC != "" {
		t.Fatalf("row without bmc gave %q", d.BMC)
	}
	for in, want := range map[string]string{
		"serial,bmc\nSN1,10.0.0.5\n":                     "line 2: bmc:",
		"serial,bmc\nSN1,https://root:calvin@10.0.0.5\n": "a BMC address holds an @: give only https://host[:port], without a user or password (BMC users and passwords go in bmc-credentials.yaml in gpuboot's state directory, never in the manifest)",
		"serial,bmc\nSN1,https://10.0.0.5/redfish/v1\n":  "without a path",
	} {
		if _, err := ParseListBytes("m.csv", []byte(in)); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "calvin") {
			t.Errorf("ParseList(%q) err = %v, want %q (and no password echoed)", in, err, want)
		}
	}
}

// An ekHash column is normalised to lower case and reaches the decision.
func TestEKHashColumn(t *testing.T) {
	l, err := ParseListBytes("m.csv", []byte("Serial,EKHash\nSN1,SHA256:"+strings.Repeat("AB", 32)+"\nSN2,\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "sha256:" + strings.Repeat("ab", 32)
	if d := (Policy{Mode: Allowlist, List: l}).Decide(identity.Identity{Serial: "SN1"}); d.EKHash != want || !d.Approve {
		t.Fatalf("decision %+v, want approval with EK %s", d, want)
	}
	if d := (Policy{Mode: Allowlist, List: l}).Decide(identity.Identity{Serial: "SN2"}); d.EKHash != "" {
		t.Fatalf("row without ekHash gave %q", d.EKHash)
	}
}

func TestDecide(t *testing.T) {
	l, _ := ParseListBytes("r1.csv", []byte(manifest))
	listed := identity.Identity{MAC: "52:54:00:00:01:01", Serial: "SN-0001"}
	stranger := identity.Identity{MAC: "52:54:00:00:09:09", Serial: "SN-9"}

	if d := (Policy{Mode: Manual, List: l}).Decide(listed); d.Approve || d.Slot != "U01" {
		t.Errorf("manual: %+v; want placement without approval", d)
	}
	if d := (Policy{Mode: Allowlist, List: l}).Decide(listed); !d.Approve || d.Rack != "r1" || !strings.HasPrefix(d.Actor, "policy:allowlist") {
		t.Errorf("allowlist listed: %+v", d)
	}
	if d := (Policy{Mode: Allowlist, List: l}).Decide(stranger); d.Approve {
		t.Errorf("allowlist approved a stranger: %+v", d)
	}
	// The row's line goes with the decision, so one row binds at most one machine.
	if d := (Policy{Mode: Allowlist, List: l}).Decide(listed); d.Line == 0 || !d.ByAllowlist() {
		t.Errorf("allowlist listed: line %d, ByAllowlist %v; want the row's line", d.Line, d.ByAllowlist())
	}
	if d := (Policy{Mode: Auto, List: l}).Decide(listed); d.ByAllowlist() {
		t.Errorf("auto approval counted as an allowlist approval: %+v", d)
	}
	if d := (Policy{Mode: Auto}).Decide(stranger); !d.Approve || d.Actor != "policy:auto" {
		t.Errorf("auto: %+v", d)
	}
	if (Policy{Mode: Auto}).Warning() == "" || (Policy{Mode: Manual}).Warning() != "" {
		t.Error("only auto warns")
	}
	if (Policy{Mode: Allowlist}).Validate() == nil {
		t.Error("allowlist without a list validated")
	}
	for in, want := range map[string]Mode{"": Manual, "Manual": Manual, "allowlist": Allowlist, "auto": Auto} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMode("yes"); err == nil {
		t.Error("ParseMode(yes) succeeded")
	}
}

func TestSelect(t *testing.T) {
	img := func(c byte) string { return strings.Repeat(string(c), 40) }
	ss := []Selector{
		{Name: "default", Image: img('a')},
		{Name: "rack-r1", Match: map[string]string{"rack": "r1"}, Image: img('b')},
		{Name: "r1-h100", Match: map[string]string{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3"}, Image: img('c')},
		{Name: "canary", Match: map[string]string{"machine": "52:54:00:00:01:07"}, Image: img('d')},
		{Name: "r1-h100-dup", Match: map[string]string{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3"}, Image: img('e')},
	}
	if err := ValidateSelectors(ss); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		labels Labels
		want   string
	}{
		{Labels{"rack": "r2"}, "default"},
		{Labels{"rack": "r1"}, "rack-r1"},
		{Labels{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3"}, "r1-h100"}, // tie with dup: first wins
		{Labels{"rack": "r2", "mac": "52:54:00:00:01:07"}, "canary"},
		// A machine term beats more terms: the canary wins over r1-h100's two.
		{Labels{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3", "mac": "52:54:00:00:01:07"}, "canary"},
	}
	for _, c := range cases {
		s, ok := Select(ss, c.labels)
		if !ok || s.Name != c.want {
			t.Errorf("Select(%v) = %q, %v; want %q", c.labels, s.Name, ok, c.want)
		}
	}
	if _, ok := Select(ss[1:2], Labels{"rack": "r2"}); ok {
		t.Error("a non-matching selector was selected")
	}
	e := Explain(ss, Labels{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3", "mac": "52:54:00:00:01:07"})
	wantLost := []string{
		`selector "default" (no terms: matches every machine) also matches and loses: "canary" names the machine`,
		`selector "rack-r1" (rack=r1) also matches and loses: "canary" names the machine`,
		`selector "r1-h100" (rack=r1, sku=NVIDIA-H100-80GB-HBM3) also matches and loses: "canary" names the machine`,
		`selector "r1-h100-dup" (rack=r1, sku=NVIDIA-H100-80GB-HBM3) also matches and loses: "canary" names the machine`,
	}
	if e.Why != `selector "canary" matches (machine=52:54:00:00:01:07)` || strings.Join(e.Lost, "\n") != strings.Join(wantLost, "\n") {
		t.Errorf("Explain = %q, lost %q", e.Why, e.Lost)
	}
	e = Explain(ss, Labels{"rack": "r1", "sku": "NVIDIA-H100-80GB-HBM3"})
	if len(e.Lost) != 3 || !strings.HasSuffix(e.Lost[2], `loses: "r1-h100" is listed first`) || !strings.HasSuffix(e.Lost[1], `loses: "r1-h100" has more terms (2 to 1)`) {
		t.Errorf("Explain lost = %q", e.Lost)
	}
	if e := Explain(ss[1:2], Labels{"rack": "r2"}); e.Matched || e.Why != "no selector matches" {
		t.Errorf("Explain of no match = %+v", e)
	}
	bad := []Selector{{Name: "x", Image: "not-an-id"}}
	if err := ValidateSelectors(bad); err == nil {
		t.Error("bad image id validated")
	}
	// Data-disk rules are checked with the agent's parser, naming the selector.
	disks := []Selector{{Name: "r1-nvme", Image: img('a'), DataDisks: []disksel.RuleSpec{{Transport: "nvme"}, {MinSize: "big"}}}}
	if err := ValidateSelectors(disks); err == nil || !strings.Contains(err.Error(), `selector "r1-nvme": dataDisks[1].minSize: "big" is not a size`) {
		t.Errorf("a bad data-disk rule: %v", err)
	}
	disks[0].DataDisks = disks[0].DataDisks[:1]
	if err := ValidateSelectors(disks); err != nil {
		t.Errorf("a good data-disk rule: %v", err)
	}
}

func TestSKU(t *testing.T) {
	if got := SKU([]string{"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"}); got != "NVIDIA-H100-80GB-HBM3" {
		t.Errorf("SKU = %q", got)
	}
	if got := SKU(nil); got != "" {
		t.Errorf("SKU(nil) = %q", got)
	}
	if got := SanitizeLabelValue(" a/b (c) "); got != "ab-c" {
		t.Errorf("SanitizeLabelValue = %q", got)
	}
}

func TestParseTaint(t *testing.T) {
	for in, want := range map[string]Taint{
		"nvidia.com/gpu=present:NoSchedule": {"nvidia.com/gpu", "present", "NoSchedule"},
		"dedicated:NoExecute":               {"dedicated", "", "NoExecute"},
	} {
		if got, err := ParseTaint(in); err != nil || got != want {
			t.Errorf("ParseTaint(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"x", "x:Sometimes", ":NoSchedule", "x=y"} {
		if _, err := ParseTaint(bad); err == nil {
			t.Errorf("ParseTaint(%q) accepted", bad)
		}
	}
}

package policy

import (
	"strings"
	"testing"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/identity"
)

// FuzzParseList: a rack manifest comes from a vendor; parsing it must never panic, and
// every entry it accepts must match itself, with its EK (from ekHash or ekCertificate)
// normalised.
func FuzzParseList(f *testing.F) {
	f.Add([]byte("serial,mac,ekHash\nS1,aa:bb:cc:dd:ee:01,sha256:" + strings.Repeat("Ab", 32) + "\n"))
	cert, _ := testEKCertificate(f)
	f.Add([]byte("serial,mac,ekCertificate\nS1,aa:bb:cc:dd:ee:01," + quoted(cert) + "\nS2,aa:bb:cc:dd:ee:02,\n"))
	f.Add([]byte("mac,ekCertificate,ekHash\naa:bb:cc:dd:ee:01,\"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n\",\n"))
	f.Add([]byte("serial,bmc\nS1,https://10.0.0.5:8443/\nS2,\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseListBytes("fuzz.csv", data)
		if err != nil {
			return
		}
		for _, e := range l.Entries {
			if e.BMC != "" {
				if a, err := bmc.NormalizeAddress(e.BMC); err != nil || a != e.BMC {
					t.Fatalf("entry %+v: bmc not normalised (%q, %v)", e, a, err)
				}
			}
			if e.EKHash != "" {
				if h, err := NormalizeEKHash(e.EKHash); err != nil || h != e.EKHash {
					t.Fatalf("entry %+v: ekHash not normalised (%q, %v)", e, h, err)
				}
			}
			if e.Serial == "" && e.MAC == "" {
				t.Fatalf("entry without serial or mac accepted: %+v", e)
			}
			got, ok := l.Match(identity.Identity{MAC: e.MAC, Serial: e.Serial})
			if !ok || got.Line != e.Line {
				t.Fatalf("entry %+v does not match itself (got %+v, %v)", e, got, ok)
			}
		}
	})
}

// FuzzMergeLists: two racks' manifests merge into one list exactly when no serial,
// MAC or EK is in both; the merged list holds every row with its file and line, and
// every row matches itself there.
func FuzzMergeLists(f *testing.F) {
	f.Add([]byte("serial,mac\nS1,aa:bb:cc:dd:ee:01\n"), []byte("serial,mac\nS2,aa:bb:cc:dd:ee:02\n"))
	f.Add([]byte("serial,mac\nS1,aa:bb:cc:dd:ee:01\n"), []byte("mac,serial\naa-bb-cc-dd-ee-01,S9\n"))
	f.Add([]byte("serial\nS1\n"), []byte("# r2\nserial,ekHash\ns1,sha256:"+strings.Repeat("ab", 32)+"\n"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		la, errA := ParseListBytes("rack-a.csv", a)
		lb, errB := ParseListBytes("rack-b.csv", b)
		if errA != nil || errB != nil {
			return
		}
		m, err := MergeLists(la, lb)
		if shared := sharedKey(la, lb); (err != nil) != (shared != "") {
			t.Fatalf("merge error %v, but the key both lists share is %q", err, shared)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "rack-a.csv line ") || !strings.Contains(err.Error(), "rack-b.csv line ") {
				t.Fatalf("merge error names not both files and lines: %v", err)
			}
			return
		}
		if len(m.Entries) != len(la.Entries)+len(lb.Entries) {
			t.Fatalf("%d entries merged from %d and %d", len(m.Entries), len(la.Entries), len(lb.Entries))
		}
		for i, e := range m.Entries {
			want := "rack-a.csv"
			if i >= len(la.Entries) {
				want = "rack-b.csv"
			}
			if e.Source != want {
				t.Fatalf("entry %d %+v: source %q lost", i, e, want)
			}
			got, ok := m.Match(identity.Identity{MAC: e.MAC, Serial: e.Serial})
			if !ok || got.Line != e.Line || got.Source != e.Source {
				t.Fatalf("entry %+v does not match itself in the merged list (got %+v, %v)", e, got, ok)
			}
		}
	})
}

// sharedKey returns a serial, MAC or EK hash both lists hold; "" when none.
func sharedKey(a, b *List) string {
	keys := map[string]bool{}
	for _, e := range a.Entries {
		for _, k := range []string{"s" + e.Serial, "m" + e.MAC, "e" + e.EKHash} {
			if len(k) > 1 {
				keys[k] = true
			}
		}
	}
	for _, e := range b.Entries {
		for _, k := range []string{"s" + e.Serial, "m" + e.MAC, "e" + e.EKHash} {
			if len(k) > 1 && keys[k] {
				return k
			}
		}
	}
	return ""
}

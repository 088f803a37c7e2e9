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

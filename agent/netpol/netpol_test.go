package netpol

import "testing"

func TestNeedsDNSRaceFix(t *testing.T) {
	for release, want := range map[string]bool{
		"6.1.0-28-amd64":  true,  // bookworm
		"6.12.12-amd64":   false, // trixie
		"6.11.0":          true,
		"6.12-rc1":        false,
		"5.10.0-33-amd64": true,
		"7.0.1":           false,
		"6.18.44-fc-v669": false,
		"":                true,
		"garbage":         true,
	} {
		if got := NeedsDNSRaceFix(release); got != want {
			t.Errorf("NeedsDNSRaceFix(%q) = %v, want %v", release, got, want)
		}
	}
}

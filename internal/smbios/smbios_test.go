package smbios

import "testing"

func TestPlaceholderSerial(t *testing.T) {
	for in, want := range map[string]bool{
		"SN-12345": false, "CZJ1234ABC": false, "0x1F": false,
		"": true, "  ": true, "Default string": true, "TO BE FILLED BY O.E.M.": true,
		"System Serial Number": true, "Not Specified": true, "N/A": true,
		"0000000000": true, "XXXXXXXX": true, "FFFF FFFF": true, "--.--": true,
	} {
		if got := PlaceholderSerial(in); got != want {
			t.Errorf("PlaceholderSerial(%q) = %v; want %v", in, got, want)
		}
	}
}

func TestPlaceholderUUID(t *testing.T) {
	for in, want := range map[string]bool{
		"4c4c4544-0042-3510-8052-b4c04f565331":   false,
		"":                                       true,
		"00000000-0000-0000-0000-000000000000":   true,
		"{FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF}": true,
		"ffffffffffffffffffffffffffffffff":       true,
	} {
		if got := PlaceholderUUID(in); got != want {
			t.Errorf("PlaceholderUUID(%q) = %v; want %v", in, got, want)
		}
	}
}

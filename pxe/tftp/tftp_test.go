package tftp

import (
	"errors"
	"strings"
	"testing"
)

var served = map[string]bool{"undionly.kpxe": true, "ipxe.efi": true, "snponly.efi": true}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"ipxe.efi", "ipxe.efi", nil},
		{"/undionly.kpxe", "undionly.kpxe", nil},
		{"//snponly.efi", "snponly.efi", nil},
		{"../etc/passwd", "", ErrForbidden},
		{"/../../etc/passwd", "", ErrForbidden},
		{"..", "", ErrForbidden},
		{".", "", ErrForbidden},
		{"sub/ipxe.efi", "", ErrForbidden},
		{"ipxe.efi/", "", ErrForbidden},
		{`..\..\boot.ini`, "", ErrForbidden},
		{"ipxe.efi\x00.png", "", ErrForbidden},
		{"ipxe efi", "", ErrForbidden},
		{"", "", ErrForbidden},
		{"/", "", ErrForbidden},
		{strings.Repeat("a", 300), "", ErrForbidden},
		{"pxelinux.0", "", ErrNotFound},
		{"IPXE.EFI", "", ErrNotFound},
	} {
		got, err := Resolve(tc.in, served)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// FuzzResolve: whatever a client asks for, Resolve returns either an
// error or exactly one of the served names.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "/undionly.kpxe", "../etc/passwd", "a/../ipxe.efi", "\\x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := Resolve(name, served)
		if err != nil {
			if got != "" {
				t.Fatalf("error with a name: %q", got)
			}
			return
		}
		if !served[got] {
			t.Fatalf("Resolve(%q) = %q, not a served file", name, got)
		}
		if strings.Contains(got, "/") || strings.Contains(got, "..") {
			t.Fatalf("Resolve(%q) = %q", name, got)
		}
	})
}

// Package smbios says which SMBIOS system serial and UUID values are placeholders that
// firmware ships instead of real ones ("Default string", the all-zero UUID). CONTRACTS §1
// counts them as absent: the agent sends them as "" and gpuboot's pxe/identity applies
// the same rule again, so both sides use this one table. It is not the identity's
// normalisation (MAC forms, UUID byte order, serial length), which is pxe/identity's.
package smbios

import "strings"

// placeholderSerials are values firmware vendors leave in the SMBIOS serial field,
// lowercase; compared case-insensitively after trimming.
var placeholderSerials = map[string]bool{
	"default string":           true,
	"to be filled by o.e.m.":   true,
	"to be filled by oem":      true,
	"system serial number":     true,
	"chassis serial number":    true,
	"not specified":            true,
	"not applicable":           true,
	"none":                     true,
	"n/a":                      true,
	"na":                       true,
	"0":                        true,
	"0123456789":               true,
	"123456789":                true,
	"serial":                   true,
	"unknown":                  true,
	"invalid":                  true,
	"oem":                      true,
	"empty":                    true,
	"xxxxxxxxxx":               true,
	"system serial":            true,
	"default":                  true,
	"to be filled by o.e.m":    true,
	"not available":            true,
	"not present":              true,
	"base board serial number": true,
}

// PlaceholderSerial reports whether the serial s, trimmed, is absent: empty, one of the
// known placeholders (any case), or made only of zeros and spaces, of 'X' or 'F' and
// spaces, or of dots, dashes and spaces.
func PlaceholderSerial(s string) bool {
	s = strings.TrimSpace(s)
	l := strings.ToLower(s)
	return s == "" || placeholderSerials[l] ||
		onlyRunes(s, "0 ") || onlyRunes(l, "x ") || onlyRunes(l, "f ") || onlyRunes(s, ". -")
}

// PlaceholderUUID reports whether the textual UUID s is absent: empty, or all zeros or
// all F (firmware that was never programmed), with or without dashes and braces.
func PlaceholderUUID(s string) bool {
	h := strings.ToLower(strings.Trim(strings.TrimSpace(s), "{}"))
	h = strings.ReplaceAll(h, "-", "")
	return h == "" || onlyRunes(h, "0") || onlyRunes(h, "f")
}

func onlyRunes(s, set string) bool {
	for _, r := range s {
		if !strings.ContainsRune(set, r) {
			return false
		}
	}
	return true
}

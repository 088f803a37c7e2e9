// Package identity is a booting machine's identity as gpuboot sees it:
// boot MAC + SMBIOS system UUID + SMBIOS system serial (docs/contracts.md §1),
// and the normalisation that makes the values read from DHCP option 97,
// iPXE variables (${net0/mac}, ${uuid}, ${serial}), the kernel command line
// (BOOTIF=01-aa-bb-…) and /sys/class/dmi/id compare equal.
//
// Real hardware ships duplicate or all-zero UUIDs and placeholder serials
// ("Default string", "To Be Filled By O.E.M."). Normalisation turns those
// into the empty string, "absent", so that they never become part of a key.
//
// Identity is the one identity type of gpuboot: httpboot builds it from the
// /boot.ipxe query and hands it to its Booter, pxe/enroll builds it from an
// agent's MachineIdentity, pxe/inventory stores it (its JSON form is the
// inventory's) and keys records by Key, and pxe/policy matches it against
// the rack manifest. This package does no I/O and holds no state.
package identity

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/gpurack/gpurack/internal/smbios"
)

// Identity is one machine's identity. An empty field is absent (unknown or
// a placeholder). Values in an Identity are always normalised: build one
// with New, or run the fields through the Normalize functions. Two
// Identities are the same machine exactly when they are == (and so when
// their Keys are equal).
type Identity struct {
	// MAC is the boot NIC's 6-byte Ethernet address in lowercase colon
	// form ("52:54:00:12:34:56"); New requires it.
	MAC string `json:"mac"`
	// UUID is the SMBIOS system UUID (product_uuid) as the canonical
	// lowercase 8-4-4-4-12 string, or "".
	UUID string `json:"uuid,omitempty"`
	// Serial is the SMBIOS system serial (product_serial), trimmed, or "".
	Serial string `json:"serial,omitempty"`
}

// Errors returned by the Normalize and New functions.
var (
	ErrBadMAC  = errors.New("not a 6-byte Ethernet MAC address")
	ErrBadUUID = errors.New("not a UUID")
)

// maxSerial bounds a serial number; SMBIOS strings are short, and the value
// comes from an unauthenticated HTTP query.
const maxSerial = 128

// New normalises mac, uuid and serial (see NormalizeMAC, NormalizeUUID and
// NormalizeSerial) into an Identity. A MAC is required; the UUID and
// serial may be empty or placeholders, which become absent.
func New(mac, uuid, serial string) (Identity, error) {
	m, err := NormalizeMAC(mac)
	if err != nil {
		return Identity{}, err
	}
	u, err := NormalizeUUID(uuid)
	if err != nil {
		return Identity{}, err
	}
	s, err := NormalizeSerial(serial)
	if err != nil {
		return Identity{}, err
	}
	return Identity{MAC: strings.ToLower(m.String()), UUID: u, Serial: s}, nil
}

// Key returns a stable string for the identity, "mac|uuid|serial" with the
// MAC in lowercase colon form and absent fields empty, for example
// "52:54:00:12:34:56|4c4c4544-0042-3510-8052-b4c04f565331|SN123".
// Two Identities have the same Key exactly when their normalised fields
// are equal. A serial containing "|" cannot be confused with another field
// because the MAC and UUID forms contain no "|" and come first.
func (id Identity) Key() string {
	return id.MAC + "|" + id.UUID + "|" + id.Serial
}

// HardwareAddr returns the MAC as 6 bytes, or nil when it is absent or not
// a MAC (an Identity not built by New).
func (id Identity) HardwareAddr() net.HardwareAddr {
	hw, err := net.ParseMAC(id.MAC)
	if err != nil || len(hw) != 6 {
		return nil
	}
	return hw
}

// String is Key, for logs.
func (id Identity) String() string { return id.Key() }

// NormalizeMAC parses a 6-byte Ethernet MAC in the forms iPXE, Linux and
// PXELINUX use: "52:54:00:12:34:56", "52-54-00-12-34-56", "525400123456",
// "5254.0012.3456", and BOOTIF's "01-52-54-00-12-34-56" (ARP hardware type
// 1 prefix). Case does not matter.
func NormalizeMAC(s string) (net.HardwareAddr, error) {
	s = strings.TrimSpace(s)
	if len(s) == 20 && (strings.HasPrefix(s, "01-") || strings.HasPrefix(s, "01:")) {
		s = s[3:] // BOOTIF=01-aa-bb-cc-dd-ee-ff
	}
	var hexDigits string
	switch {
	case len(s) == 12:
		hexDigits = s
	case len(s) == 17 && (strings.Count(s, ":") == 5 || strings.Count(s, "-") == 5):
		hexDigits = strings.NewReplacer(":", "", "-", "").Replace(s)
	case len(s) == 14 && strings.Count(s, ".") == 2:
		hexDigits = strings.ReplaceAll(s, ".", "")
	default:
		return nil, fmt.Errorf("MAC %q: %w", truncate(s), ErrBadMAC)
	}
	b, err := hex.DecodeString(hexDigits)
	if err != nil || len(b) != 6 {
		return nil, fmt.Errorf("MAC %q: %w", truncate(s), ErrBadMAC)
	}
	if isAll(b, 0x00) || isAll(b, 0xff) {
		return nil, fmt.Errorf("MAC %q is all zeros or broadcast: %w", truncate(s), ErrBadMAC)
	}
	return net.HardwareAddr(b), nil
}

// NormalizeUUID parses a textual SMBIOS system UUID, as iPXE's ${uuid}
// and /sys/class/dmi/id/product_uuid print it, with or without dashes or
// braces, in any case, and returns the canonical lowercase 8-4-4-4-12 form.
// The text form is already in SMBIOS 2.6+ display order, so no bytes are
// swapped. "" and the all-zero and all-FF UUIDs (firmware that was never
// programmed) give "" with no error.
func NormalizeUUID(s string) (string, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return "", nil
	}
	hexDigits := strings.ReplaceAll(s, "-", "")
	if len(hexDigits) != 32 || (len(s) != 32 && !dashedUUID(s)) {
		return "", fmt.Errorf("UUID %q: %w: want 32 hex digits as 8-4-4-4-12", truncate(s), ErrBadUUID)
	}
	b, err := hex.DecodeString(hexDigits)
	if err != nil {
		return "", fmt.Errorf("UUID %q: %w: %v", truncate(s), ErrBadUUID, err)
	}
	return formatUUID(b), nil
}

// NormalizeUUIDOption97 converts the value of DHCP option 97 (Client
// Machine Identifier, RFC 4578 §2.3: type 0 followed by 16 bytes) to the
// canonical UUID string. PXE clients put the SMBIOS UUID there as SMBIOS
// stores it: since SMBIOS 2.6 the first three fields are little-endian
// (SMBIOS 3.x §7.2.1), so they are byte-swapped to get the string that
// product_uuid and iPXE print. A value without the leading type byte (16
// bytes; some ROMs) is accepted. All-zero and all-FF give "" with no
// error; any other length or a type other than 0 is an error.
func NormalizeUUIDOption97(raw []byte) (string, error) {
	switch {
	case len(raw) == 17 && raw[0] == 0:
		raw = raw[1:]
	case len(raw) == 16:
	default:
		return "", fmt.Errorf("option 97 of %d bytes: %w: want type 0 and 16 bytes (RFC 4578 §2.3)", len(raw), ErrBadUUID)
	}
	b := make([]byte, 16)
	copy(b, raw)
	// time_low, time_mid, time_hi_and_version are little-endian in SMBIOS.
	b[0], b[1], b[2], b[3] = raw[3], raw[2], raw[1], raw[0]
	b[4], b[5] = raw[5], raw[4]
	b[6], b[7] = raw[7], raw[6]
	return formatUUID(b), nil
}

// UUIDOption97 is the inverse of NormalizeUUIDOption97: it returns the 17
// bytes a PXE client sends in option 97 for the canonical UUID string u.
// For tests and for clients that need to fake one.
func UUIDOption97(u string) ([]byte, error) {
	n, err := NormalizeUUID(u)
	if err != nil {
		return nil, err
	}
	if n == "" {
		return nil, fmt.Errorf("UUID %q is absent or a placeholder", u)
	}
	b, _ := hex.DecodeString(strings.ReplaceAll(n, "-", ""))
	out := make([]byte, 17)
	copy(out[1:], b)
	out[1], out[2], out[3], out[4] = b[3], b[2], b[1], b[0]
	out[5], out[6] = b[5], b[4]
	out[7], out[8] = b[7], b[6]
	return out, nil
}

// NormalizeSerial trims s and returns "" for placeholder serials ("Default
// string", "To Be Filled By O.E.M.", "System Serial Number", "0", strings
// made only of zeros, spaces or 'X'/'F'…: internal/smbios) and for "". A serial longer than
// 128 bytes or with control or non-ASCII characters is an error: SMBIOS
// serials are short printable strings, and this one arrives unauthenticated.
func NormalizeSerial(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", nil
	}
	if len(s) > maxSerial {
		return "", fmt.Errorf("serial of %d bytes is longer than %d: not an SMBIOS serial", len(s), maxSerial)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("serial %q has a control or non-ASCII byte at %d: not an SMBIOS serial", truncate(s), i)
		}
	}
	if smbios.PlaceholderSerial(s) {
		return "", nil
	}
	return s, nil
}

func dashedUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for _, i := range []int{8, 13, 18, 23} {
		if s[i] != '-' {
			return false
		}
	}
	return true
}

// formatUUID formats 16 bytes in display order; all-zero and all-FF give "".
func formatUUID(b []byte) string {
	h := hex.EncodeToString(b)
	if smbios.PlaceholderUUID(h) {
		return ""
	}
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func isAll(b []byte, v byte) bool {
	for _, c := range b {
		if c != v {
			return false
		}
	}
	return true
}

// truncate shortens untrusted input for error messages.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

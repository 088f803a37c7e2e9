package identity

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestNormalizeMAC(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"52:54:00:12:34:56", "52:54:00:12:34:56"},
		{"52-54-00-12-34-AB", "52:54:00:12:34:ab"},
		{"525400123456", "52:54:00:12:34:56"},
		{"5254.0012.3456", "52:54:00:12:34:56"},
		{"01-52-54-00-12-34-56", "52:54:00:12:34:56"},
		{" 52:54:00:12:34:56\n", "52:54:00:12:34:56"},
	} {
		got, err := NormalizeMAC(tc.in)
		if err != nil || got.String() != tc.want {
			t.Errorf("NormalizeMAC(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "52:54:00:12:34", "52:54:00:12:34:5g", "00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "52:54-00:12:34:56:", "02-52-54-00-12-34-56", "52:54:00:12:34:56:78:9a"} {
		if got, err := NormalizeMAC(in); !errors.Is(err, ErrBadMAC) {
			t.Errorf("NormalizeMAC(%q) = %v, %v; want ErrBadMAC", in, got, err)
		}
	}
}

func TestNormalizeUUID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"4C4C4544-0042-3510-8052-B4C04F565331", "4c4c4544-0042-3510-8052-b4c04f565331"},
		{"{4c4c4544-0042-3510-8052-b4c04f565331}", "4c4c4544-0042-3510-8052-b4c04f565331"},
		{"4c4c454400423510805 2b4c04f565331", ""}, // rejected below instead
		{"", ""},
		{"00000000-0000-0000-0000-000000000000", ""},
		{"FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", ""},
		{"4c4c454400423510 8052b4c04f565331", ""},
		{"4c4c4544004235108052b4c04f565331", "4c4c4544-0042-3510-8052-b4c04f565331"},
	} {
		got, err := NormalizeUUID(tc.in)
		if tc.want == "" && err != nil {
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeUUID(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"4c4c4544-0042-3510-8052", "4c4c4544-00423-510-8052-b4c04f565331", "zz4c4544-0042-3510-8052-b4c04f565331"} {
		if got, err := NormalizeUUID(in); !errors.Is(err, ErrBadUUID) {
			t.Errorf("NormalizeUUID(%q) = %q, %v; want ErrBadUUID", in, got, err)
		}
	}
}

func TestOption97ByteOrder(t *testing.T) {
	// QEMU -smbios type=1,uuid=11223344-5566-7788-99aa-bbccddeeff00 puts
	// the first three fields little-endian in the SMBIOS table and in
	// option 97; product_uuid prints the string back.
	raw := []byte{0, 0x44, 0x33, 0x22, 0x11, 0x66, 0x55, 0x88, 0x77, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00}
	got, err := NormalizeUUIDOption97(raw)
	if want := "11223344-5566-7788-99aa-bbccddeeff00"; err != nil || got != want {
		t.Fatalf("NormalizeUUIDOption97 = %q, %v; want %q", got, err, want)
	}
	back, err := UUIDOption97(got)
	if err != nil || !bytes.Equal(back, raw) {
		t.Fatalf("UUIDOption97(%q) = % x, %v; want % x", got, back, err, raw)
	}
	if got, err := NormalizeUUIDOption97(raw[1:]); err != nil || got != "11223344-5566-7788-99aa-bbccddeeff00" {
		t.Errorf("16-byte option 97 = %q, %v", got, err)
	}
	if got, err := NormalizeUUIDOption97(make([]byte, 17)); err != nil || got != "" {
		t.Errorf("all-zero option 97 = %q, %v; want absent", got, err)
	}
	ff := bytes.Repeat([]byte{0xff}, 17)
	ff[0] = 0
	if got, err := NormalizeUUIDOption97(ff); err != nil || got != "" {
		t.Errorf("all-FF option 97 = %q, %v; want absent", got, err)
	}
	for _, bad := range [][]byte{nil, {1}, append([]byte{1}, raw[1:]...), make([]byte, 18)} {
		if _, err := NormalizeUUIDOption97(bad); !errors.Is(err, ErrBadUUID) {
			t.Errorf("NormalizeUUIDOption97(% x) err = %v; want ErrBadUUID", bad, err)
		}
	}
}

func TestNormalizeSerial(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"SN-12345", "SN-12345"},
		{"  CZJ1234ABC ", "CZJ1234ABC"},
		{"Default string", ""},
		{"To Be Filled By O.E.M.", ""},
		{"TO BE FILLED BY O.E.M.", ""},
		{"System Serial Number", ""},
		{"Not Specified", ""},
		{"0000000000", ""},
		{"XXXXXXXX", ""},
		{"", ""},
	} {
		got, err := NormalizeSerial(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("NormalizeSerial(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"a\x00b", "ü", string(bytes.Repeat([]byte("a"), 129))} {
		if _, err := NormalizeSerial(in); err == nil {
			t.Errorf("NormalizeSerial(%q): want an error", in)
		}
	}
}

func TestKey(t *testing.T) {
	a, err := New("52-54-00-12-34-56", "4C4C4544-0042-3510-8052-B4C04F565331", "Default string")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New("52:54:00:12:34:56", "4c4c4544004235108052b4c04f565331", "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != b.Key() {
		t.Errorf("keys differ: %q vs %q", a.Key(), b.Key())
	}
	if want := "52:54:00:12:34:56|4c4c4544-0042-3510-8052-b4c04f565331|"; a.Key() != want {
		t.Errorf("Key = %q; want %q", a.Key(), want)
	}
	c, _ := New("52:54:00:12:34:56", "", "SN1")
	if c.Key() == a.Key() {
		t.Error("different serial, same key")
	}
	if _, err := New("", "", ""); !errors.Is(err, ErrBadMAC) {
		t.Errorf("New without MAC: %v", err)
	}
}

// FuzzNormalize checks that normalisation never panics, is idempotent, and
// that Key is a function of the normalised fields.
func FuzzNormalize(f *testing.F) {
	f.Add("52:54:00:12:34:56", "4c4c4544-0042-3510-8052-b4c04f565331", "SN1", []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add("01-52-54-00-12-34-56", "", "Default string", []byte{})
	f.Add("5254.0012.3456", "{FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF}", "To Be Filled By O.E.M.", make([]byte, 17))
	f.Fuzz(func(t *testing.T, mac, uuid, serial string, opt97 []byte) {
		id, err := New(mac, uuid, serial)
		if err == nil {
			again, err := New(id.MAC, id.UUID, id.Serial)
			if err != nil {
				t.Fatalf("normalised identity %q does not normalise again: %v", id.Key(), err)
			}
			if again.Key() != id.Key() {
				t.Fatalf("not idempotent: %q -> %q", id.Key(), again.Key())
			}
			if hw := id.HardwareAddr(); len(hw) != 6 || id.MAC != hw.String() {
				t.Fatalf("MAC %q is not a 6-byte MAC in lowercase colon form", id.MAC)
			}
			if again != id {
				t.Fatalf("not idempotent: %+v -> %+v", id, again)
			}
		}
		if u, err := NormalizeUUIDOption97(opt97); err == nil && u != "" {
			back, err := UUIDOption97(u)
			if err != nil {
				t.Fatalf("UUIDOption97(%q): %v", u, err)
			}
			if again, _ := NormalizeUUIDOption97(back); again != u {
				t.Fatalf("option 97 round trip %q -> %q", u, again)
			}
		}
	})
}

// TestJSONForm pins the JSON form: pxe/inventory stores an Identity in every machine
// record, so a change here would make existing inventories unreadable.
func TestJSONForm(t *testing.T) {
	for _, tc := range []struct {
		mac, uuid, serial, want string
	}{
		{"52-54-00-12-34-56", "4C4C4544-0042-3510-8052-B4C04F565331", "SN1",
			`{"mac":"52:54:00:12:34:56","uuid":"4c4c4544-0042-3510-8052-b4c04f565331","serial":"SN1"}`},
		{"525400123456", "", "Default string", `{"mac":"52:54:00:12:34:56"}`},
	} {
		id, err := New(tc.mac, tc.uuid, tc.serial)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(id)
		if err != nil || string(b) != tc.want {
			t.Errorf("json.Marshal(%v) = %s, %v; want %s", id, b, err, tc.want)
		}
		var back Identity
		if err := json.Unmarshal([]byte(tc.want), &back); err != nil || back != id {
			t.Errorf("json.Unmarshal(%s) = %+v, %v; want %+v", tc.want, back, err, id)
		}
	}
}

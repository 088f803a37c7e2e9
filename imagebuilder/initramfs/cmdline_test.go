package initramfs

import (
	"reflect"
	"strings"
	"testing"
)

const sum = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSplit(t *testing.T) {
	cases := map[string][]string{
		"":                              nil,
		"  a  b ":                       {"a", "b"},
		`x="a b" y`:                     {"x=a b", "y"},
		`"quoted word" z=""`:            {"quoted word", "z="},
		"console=ttyS0,115200\tpanic=1": {"console=ttyS0,115200", "panic=1"},
	}
	for in, want := range cases {
		if got := Split(in); !reflect.DeepEqual(got, want) {
			t.Errorf("Split(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseCmdline(t *testing.T) {
	c, err := ParseCmdline("console=ttyS0 gpurack.rootfs.sha256=" + strings.Repeat("f", 64) +
		" initrd=initrd.img gpurack.rootfs=http://10.0.2.2:8080/images/abc/rootfs.squashfs BOOTIF=01-52-54-00-12-34-56 gpurack.rootfs.sha256=" + sum + " gpurack.onfail=poweroff gpurack.rootfs.retries=3")
	if err != nil {
		t.Fatal(err)
	}
	if c.RootfsSHA256 != sum || c.RootfsURL != "http://10.0.2.2:8080/images/abc/rootfs.squashfs" || c.BootMAC.String() != "52:54:00:12:34:56" ||
		c.OnFail != FailPoweroff || c.Retries != 3 || c.Init != "/sbin/init" {
		t.Fatalf("got %+v", c)
	}
	// Packed rootfs: no URL is fine.
	if c, err := ParseCmdline("gpurack.rootfs.sha256=" + sum); err != nil || c.RootfsURL != "" || c.OnFail != FailReboot {
		t.Fatalf("packed: %+v %v", c, err)
	}
}

func TestParseCmdlineErrors(t *testing.T) {
	cases := map[string]string{
		"console=ttyS0":                                              "gpurack.rootfs.sha256= is missing",
		"gpurack.rootfs.sha256=abc":                                  "want 64 lowercase hex digits",
		"gpurack.rootfs.sha256=" + strings.ToUpper(sum):              "want 64 lowercase hex digits",
		"gpurack.rootfs.sha256=" + sum + " gpurack.rootfs=ftp://x/r": "want an http:// or https:// URL",
		"gpurack.rootfs.sha256=" + sum + " BOOTIF=52:54:00:12:34:56": "want 01-aa-bb-cc-dd-ee-ff",
		"gpurack.rootfs.sha256=" + sum + " gpurack.onfail=explode":   "want reboot, poweroff or halt",
		"gpurack.rootfs.sha256=" + sum + " gpurack.rootfs.retries=0": "from 1 to 1000",
		"gpurack.rootfs.sha256=" + sum + " gpurack.init=sbin/init":   "absolute path",
	}
	for in, want := range cases {
		_, err := ParseCmdline(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCmdline(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 gpurack.rootfs.sha256=" + sum + " gpurack.rootfs=http://h/r BOOTIF=01-52-54-00-12-34-56")
	f.Add(`a="b c" "d`)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCmdline(s)
		if c == nil {
			t.Fatal("nil config")
		}
		if err == nil {
			if len(c.RootfsSHA256) != 64 || c.Retries < 1 || !strings.HasPrefix(c.Init, "/") {
				t.Fatalf("accepted an invalid config %+v from %q", c, s)
			}
		}
		for _, w := range Split(s) {
			if w == "" {
				// An empty word only comes from quotes around nothing.
				if !strings.Contains(s, `"`) {
					t.Fatalf("empty word from %q", s)
				}
			}
		}
	})
}

package enroll

import (
	"strings"
	"testing"
)

const pin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name, cmdline, flagEP, flagPin string
		want                           Target
		ok                             bool
		err                            string
	}{
		{name: "none", cmdline: "console=ttyS0 quiet"},
		{name: "cmdline", cmdline: "BOOTIF=01-aa-bb-cc-dd-ee-ff gpurack.enroll=10.0.0.1:8443 gpurack.enroll.ca=" + pin,
			want: Target{"10.0.0.1:8443", pin}, ok: true},
		{name: "last wins", cmdline: "gpurack.enroll=a:1 gpurack.enroll=b:2 gpurack.enroll.ca=" + pin, want: Target{"b:2", pin}, ok: true},
		{name: "flags override", cmdline: "gpurack.enroll=a:1 gpurack.enroll.ca=sha256:bad", flagEP: "gpuboot.lab:8443", flagPin: pin,
			want: Target{"gpuboot.lab:8443", pin}, ok: true},
		{name: "ipv6", cmdline: "gpurack.enroll=[fd00::1]:8443 gpurack.enroll.ca=" + pin, want: Target{"[fd00::1]:8443", pin}, ok: true},
		{name: "no pin", cmdline: "gpurack.enroll=10.0.0.1:8443", want: Target{Endpoint: "10.0.0.1:8443"}, ok: true, err: "no CA pin"},
		{name: "bad pin", cmdline: "gpurack.enroll=10.0.0.1:8443 gpurack.enroll.ca=md5:00", want: Target{"10.0.0.1:8443", "md5:00"}, ok: true, err: "CA pin"},
		{name: "no port", cmdline: "gpurack.enroll=10.0.0.1 gpurack.enroll.ca=" + pin, want: Target{"10.0.0.1", pin}, ok: true, err: "host:port"},
		{name: "pin only", cmdline: "gpurack.enroll.ca=" + pin, want: Target{Pin: pin}, err: "no gpuboot"},
		{name: "prefix is not the key", cmdline: "gpurack.enrollx=a:1 xgpurack.enroll=b:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := Resolve(tc.cmdline, tc.flagEP, tc.flagPin)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Resolve = %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("err = %v, want containing %q", err, tc.err)
			}
		})
	}
}

// FuzzParseCmdline: /proc/cmdline is whatever the boot loader passed (gpuboot's iPXE
// script over plain HTTP); parsing and validating it must never panic, and a value
// that validates must be exactly what the command line carried.
func FuzzParseCmdline(f *testing.F) {
	f.Add("BOOTIF=01-aa-bb-cc-dd-ee-ff gpurack.enroll=10.0.0.1:8443 gpurack.enroll.ca=" + pin)
	f.Add("gpurack.enroll=\"[::1]:1\" gpurack.enroll.ca= =x ==")
	f.Add("\x00gpurack.enroll=\xff:\xff\tgpurack.enroll.ca=sha256:")
	f.Fuzz(func(t *testing.T, s string) {
		tg := ParseCmdline(s)
		if strings.ContainsAny(tg.Endpoint, " \t\n") || strings.ContainsAny(tg.Pin, " \t\n") {
			t.Fatalf("value with whitespace: %+v", tg)
		}
		if tg.Endpoint != "" && !strings.Contains(s, tg.Endpoint) {
			t.Fatalf("endpoint %q not in %q", tg.Endpoint, s)
		}
		if _, _, err := Resolve(s, "", ""); err == nil && tg.Endpoint != "" && tg.Pin == "" {
			t.Fatalf("validated without a pin: %+v", tg)
		}
	})
}

package enroll

import (
	"strings"
	"testing"

	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

func TestStartWarnings(t *testing.T) {
	if inventory.KeyLiveness.String() != "3m0s" {
		t.Fatalf("KeyLiveness is %s: update keyLivenessWords", inventory.KeyLiveness)
	}
	list := func(csv string) *policy.List {
		l, err := policy.ParseListBytes("rack.csv", []byte(csv))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ek := "sha256:" + strings.Repeat("ab", 32)
	noEK := list("serial,mac\nS1,52:54:00:00:0f:01\n")
	allEK := list("serial,mac,ekHash\nS1,52:54:00:00:0f:01," + ek + "\n")
	cases := []struct {
		name string
		cfg  Config
		want []string // one substring per warning, in order
	}{
		{"manual, defaults", Config{Policy: policy.Policy{Mode: policy.Manual}}, []string{"reenroll auto with identity mac-uuid-serial"}},
		{"manual, reenroll manual", Config{Policy: policy.Policy{Mode: policy.Manual}, Reenroll: ReenrollManual}, nil},
		{"production", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: allEK}, Identity: IdentityTPM}, nil},
		{"allowlist without TPM", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: noEK}, Reenroll: ReenrollManual},
			[]string{"whoever registers first with a listed serial and MAC"}},
		{"allowlist EK rows without TPM", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: allEK}, Reenroll: ReenrollManual},
			[]string{"the 1 rows of rack.csv that name a TPM EK approve nobody"}},
		{"allowlist, tpm, rows without EK", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: noEK}, Identity: IdentityTPM},
			[]string{"1 of the 1 rows of rack.csv name no TPM EK"}},
		{"tpm-or-fallback, EK rows", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: allEK}, Identity: IdentityTPMOrFallback},
			[]string{"reenroll auto with identity tpm-or-fallback"}},
		{"tpm-or-fallback, rows without EK", Config{Policy: policy.Policy{Mode: policy.Allowlist, List: noEK}, Identity: IdentityTPMOrFallback, Reenroll: ReenrollManual},
			[]string{"any TPM or none"}},
		{"auto", Config{Policy: policy.Policy{Mode: policy.Auto}, Reenroll: ReenrollManual}, []string{"approval auto with identity mac-uuid-serial"}},
	}
	for _, c := range cases {
		got := StartWarnings(c.cfg)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d warnings %q; want %d", c.name, len(got), got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) || !strings.Contains(got[i], "set ") && !strings.Contains(got[i], "give each row") {
				t.Errorf("%s: warning %q; want it to contain %q and name the setting that closes the gap", c.name, got[i], w)
			}
		}
	}
}

package sim

import (
	"strings"
	"testing"
)

func TestParseFault(t *testing.T) {
	ok := []struct {
		in   string
		want Fault
	}{
		{"xid:79@gpu3", Fault{KindXID, 3, 79}},
		{"pcie-width:8@gpu1", Fault{KindPCIeWidth, 1, 8}},
		{"ecc-uncorrected:2@gpu0", Fault{KindECCUncorrected, 0, 2}},
		{"gpu-lost@gpu7", Fault{KindGPULost, 7, 0}},
		{"driver-unloaded", Fault{KindDriverUnloaded, -1, 0}},
		{"driver-mismatch", Fault{KindDriverMismatch, -1, 0}},
		{" row-remap-pending@gpu2 ", Fault{KindRowRemapPending, 2, 0}},
		{"stray-process:512@gpu4", Fault{KindStrayProcess, 4, 512}},
		{"power-brake@gpu5", Fault{KindPowerBrake, 5, 0}},
		{"gpu-missing@gpu6", Fault{KindGPUMissing, 6, 0}},
	}
	for _, c := range ok {
		got, err := ParseFault(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseFault(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if again, err := ParseFault(got.String()); err != nil || again != got {
			t.Errorf("round trip %q -> %q -> %+v, %v", c.in, got.String(), again, err)
		}
	}
	bad := []struct{ in, msg string }{
		{"", "empty"},
		{"xid@gpu3", "needs a value"},
		{"xid:79", "needs a GPU"},
		{"gpu-lost:1@gpu1", "takes no value"},
		{"driver-unloaded@gpu0", "node-level"},
		{"bogus@gpu0", "unknown kind"},
		{"xid:abc@gpu0", "not a decimal integer"},
		{"xid:-1@gpu0", "not a decimal integer"},
		{"xid:79@gpu", "not gpuN"},
		{"xid:79@gpu01", "not gpuN"},
		{"xid:79@cpu1", "not gpuN"},
		{"xid:79@gpu64", "not gpuN"},
		{"pcie-width:7@gpu0", "width must be"},
		{"pcie-gen:9@gpu0", "generation must be"},
		{"xid:0@gpu0", "XID must be"},
	}
	for _, c := range bad {
		_, err := ParseFault(c.in)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("ParseFault(%q) error = %v; want one containing %q", c.in, err, c.msg)
		}
	}
}

func TestGrammarListsEveryKind(t *testing.T) {
	g := Grammar()
	for k := KindXID; k < kindCount; k++ {
		if !strings.Contains(g, k.String()) {
			t.Errorf("Grammar() misses %s", k)
		}
	}
}

// FuzzParseFault: any input either fails with an error naming it or parses into a
// fault whose canonical form parses back to the same fault.
func FuzzParseFault(f *testing.F) {
	for _, s := range []string{"xid:79@gpu3", "driver-unloaded", "pcie-width:8@gpu1", "gpu-lost@gpu7", "a:b@c", "@", ":"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseFault(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fault ") {
				t.Fatalf("error %q does not name the input", err)
			}
			return
		}
		again, err := ParseFault(got.String())
		if err != nil || again != got {
			t.Fatalf("%q parsed to %+v, canonical %q reparsed to %+v, %v", s, got, got.String(), again, err)
		}
		if got.Kind.NodeLevel() != (got.GPU == -1) {
			t.Fatalf("%q: node-level %v but GPU %d", s, got.Kind.NodeLevel(), got.GPU)
		}
	})
}

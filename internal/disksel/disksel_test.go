package disksel

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"512", 512},
		{"960G", 960e9},
		{"960GB", 960e9},
		{"3.84T", 3840e9},
		{"1.92t", 1920e9},
		{"1TiB", 1 << 40},
		{"1.5KiB", 1536},
		{"7.68 TB", 7680e9},
		{"0.0001K", 0}, // rounded down to a whole byte
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "G", "1.2.3G", ".5T", "5.T", "1XB", "-1G", "1e3", "9999999P", "1 T B", "0x10", "8EiB"} {
		if n, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, n)
		} else if !strings.Contains(err.Error(), "e.g. 960G") {
			t.Errorf("ParseSize(%q) error %q does not say what to write", in, err)
		}
	}
}

func TestParseSelectorErrorsNameTheFieldAndWhatToWrite(t *testing.T) {
	for _, tc := range []struct {
		spec RuleSpec
		want []string
	}{
		{RuleSpec{}, []string{"dataDisks[0].path:", "sets no field", "transport: nvme"}},
		{RuleSpec{Path: "nvme0n1"}, []string{"dataDisks[0].path:", "glob under /dev", "/dev/nvme*n1"}},
		{RuleSpec{Path: "/dev/nvme[0n1"}, []string{"dataDisks[0].path:", "not a valid glob"}},
		{RuleSpec{Model: "SAMSUNG ["}, []string{"dataDisks[0].model:", "not a valid glob"}},
		{RuleSpec{Model: " SAMSUNG*"}, []string{"dataDisks[0].model:", "space"}},
		{RuleSpec{MinSize: "lots"}, []string{"dataDisks[0].minSize:", `"lots" is not a size`, "960G"}},
		{RuleSpec{MaxSize: "0"}, []string{"dataDisks[0].maxSize:", "zero", "leave the field out"}},
		{RuleSpec{MinSize: "2T", MaxSize: "1T"}, []string{"dataDisks[0].maxSize:", "below minSize 2T"}},
		{RuleSpec{Transport: "NVMe"}, []string{"dataDisks[0].transport:", "one of nvme, sata"}},
		{RuleSpec{Transport: "loop"}, []string{"dataDisks[0].transport:"}},
	} {
		_, err := ParseSelector("dataDisks", []RuleSpec{tc.spec})
		if err == nil {
			t.Errorf("%+v: no error", tc.spec)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q lacks %q", tc.spec, err, w)
			}
		}
	}
	// Every bad rule is reported, each with its index.
	_, err := ParseSelector("dataDisks", []RuleSpec{{Transport: "nvme"}, {}, {MinSize: "x"}})
	if err == nil || !strings.Contains(err.Error(), "dataDisks[1]") || !strings.Contains(err.Error(), "dataDisks[2].minSize") {
		t.Errorf("two bad rules: %v", err)
	}
}

func TestSelectorSelects(t *testing.T) {
	nvme := Disk{Path: "/dev/nvme0n1", Model: "SAMSUNG MZQL23T8HCLS-00A07", Size: 3840e9, Transport: TransportNVMe}
	nvme2 := Disk{Path: "/dev/nvme1n1", Model: "Micron_7450", Size: 960e9, Transport: TransportNVMe}
	sata := Disk{Path: "/dev/sda", Model: "SAMSUNG MZ7L3480", Size: 480e9, Transport: TransportSATA}
	usb := Disk{Path: "/dev/sdb", Model: "Virtual Media", Size: 1e9, Transport: TransportUSB, Removable: true}
	ro := Disk{Path: "/dev/nvme2n1", Model: "SAMSUNG MZQL23T8HCLS-00A07", Size: 3840e9, Transport: TransportNVMe, ReadOnly: true}
	all := []Disk{nvme, nvme2, sata, usb, ro}
	names := func(s Selector) string {
		var out []string
		for _, d := range all {
			if s.Selects(d) {
				out = append(out, strings.TrimPrefix(d.Path, "/dev/"))
			}
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name  string
		rules []RuleSpec
		want  string
	}{
		{"no rules select nothing", nil, ""},
		{"transport", []RuleSpec{{Transport: "nvme"}}, "nvme0n1,nvme1n1"},
		{"model glob", []RuleSpec{{Model: "SAMSUNG*"}}, "nvme0n1,sda"},
		{"model is case-sensitive", []RuleSpec{{Model: "samsung*"}}, ""},
		{"path glob", []RuleSpec{{Path: "/dev/nvme*n1"}}, "nvme0n1,nvme1n1"},
		{"size range", []RuleSpec{{MinSize: "900G", MaxSize: "1T"}}, "nvme1n1"},
		{"min size", []RuleSpec{{MinSize: "1T"}}, "nvme0n1"},
		{"fields are and-ed", []RuleSpec{{Transport: "nvme", Model: "Micron*"}}, "nvme1n1"},
		{"rules are or-ed", []RuleSpec{{Path: "/dev/sda"}, {Model: "Micron*"}}, "nvme1n1,sda"},
		{"removable never", []RuleSpec{{Transport: "usb"}}, ""},
		{"read-only never", []RuleSpec{{Path: "/dev/nvme2n1"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSelector("dataDisks", tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			if got := names(s); got != tc.want {
				t.Errorf("selected %q, want %q", got, tc.want)
			}
		})
	}
	if (Rule{}).Match(nvme) {
		t.Error("a zero Rule matched a disk")
	}
}

// FuzzParseSelector: the rules come from profile and gpuboot YAML. Parsing never panics,
// a parsed rule is never empty, and a size that parses is never negative.
func FuzzParseSelector(f *testing.F) {
	f.Add("/dev/nvme*n1", "SAMSUNG*", "960G", "3.84T", "nvme")
	f.Add("", "", "1.5KiB", "", "")
	f.Add("/dev/[", "", "99999999999999999999P", "0", "sas")
	f.Fuzz(func(t *testing.T, path, model, minSize, maxSize, transport string) {
		spec := RuleSpec{Path: path, Model: model, MinSize: minSize, MaxSize: maxSize, Transport: transport}
		s, err := ParseSelector("dataDisks", []RuleSpec{spec})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "dataDisks[0].") {
				t.Fatalf("error %q does not name the rule", err)
			}
			return
		}
		r := s.Rules[0]
		if r == (Rule{}) || r.MinSize < 0 || r.MaxSize < 0 {
			t.Fatalf("parsed %+v into %+v", spec, r)
		}
		r.Match(Disk{Path: path, Model: model, Size: r.MinSize, Transport: Transport(transport)})
	})
}

package config

import (
	"strings"
	"testing"
)

// policy.allowlist takes one file (as before) or a list of files, one per rack;
// relative names resolve against the configuration file's directory.
func TestAllowlistPaths(t *testing.T) {
	cases := []struct {
		yaml string
		want []string
	}{
		{"policy: {approval: allowlist, allowlist: rack-r1.csv}\n", []string{"/etc/gpuboot/rack-r1.csv"}},
		{"policy: {approval: allowlist, allowlist: [rack-r1.csv, /srv/racks/rack-r2.csv]}\n", []string{"/etc/gpuboot/rack-r1.csv", "/srv/racks/rack-r2.csv"}},
		{"policy:\n  approval: allowlist\n  allowlist:\n    - racks/r1.csv\n    - \"2024.csv\"\n    - 2025.csv\n", []string{"/etc/gpuboot/racks/r1.csv", "/etc/gpuboot/2024.csv", "/etc/gpuboot/2025.csv"}},
		{"policy: {approval: manual, allowlist: placement.csv}\n", []string{"/etc/gpuboot/placement.csv"}},
		{"policy: {approval: manual, allowlist: }\n", nil},
		{"policy: {approval: manual, allowlist: ''}\n", nil},
	}
	for _, c := range cases {
		cfg, err := Parse("/etc/gpuboot/gpuboot.yaml", []byte(minimal+c.yaml))
		if err != nil {
			t.Errorf("%q: %v", c.yaml, err)
			continue
		}
		if strings.Join(cfg.Policy.Allowlist, "|") != strings.Join(c.want, "|") {
			t.Errorf("%q: allowlist %q, want %q", c.yaml, cfg.Policy.Allowlist, c.want)
		}
	}
}

// A type that is neither a file name nor a list of them, an empty item, a file given
// twice or an empty list under approval: allowlist is an error on the field's line.
func TestAllowlistPathErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"policy: {approval: allowlist, allowlist: {r1: rack-r1.csv}}\n",
			"g.yaml:6: policy.allowlist: expected a file name or a list of file names, found a mapping (write `allowlist: rack-r1.csv` or `allowlist: [rack-r1.csv, rack-r2.csv]`)"},
		{"policy: {approval: allowlist, allowlist: true}\n", "g.yaml:6: policy.allowlist: expected a file name, found the boolean true; quote it if it is one"},
		{"policy: {approval: allowlist, allowlist: [a.csv, [b.csv]]}\n", "g.yaml:6: policy.allowlist: item 2: expected a file name, found a list"},
		{"policy: {approval: allowlist, allowlist: [a.csv, {b: c}]}\n", "g.yaml:6: policy.allowlist: item 2: expected a file name, found a mapping"},
		{"policy: {approval: allowlist, allowlist: [a.csv, '']}\n", "g.yaml:6: policy.allowlist: item 2 is empty: give a file name"},
		{"policy: {approval: allowlist, allowlist: [a.csv, ~]}\n", "g.yaml:6: policy.allowlist: item 2 is empty"},
		{"policy: {approval: allowlist, allowlist: []}\n", "g.yaml:6: policy.allowlist: required with approval: allowlist (the rack manifest CSV, or a list of them, one per rack)"},
		{"policy:\n  approval: allowlist\n  allowlist: [a.csv, ./a.csv]\n", "g.yaml:8: policy.allowlist: a.csv is listed twice: list each rack manifest once"},
	}
	for _, c := range cases {
		_, err := Parse("g.yaml", []byte(minimal+c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v\nwant %q", c.yaml, err, c.want)
		}
	}
}

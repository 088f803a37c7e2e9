package controlplane

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// FuzzParseRestartRequest feeds arbitrary lines to the supervisor's restart-request
// parser (the Unix socket is its owner's only, but a request names processes to kill):
// it must not panic, and what it accepts names each component at most once, in start
// order, and only components.
func FuzzParseRestartRequest(f *testing.F) {
	for _, s := range []string{"restart etcd\n", "restart kube-scheduler etcd kube-apiserver", "restart", "restart etcd etcd",
		"restart ../etcd", "RESTART etcd", "restart \x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		names, err := parseRestartRequest(line)
		if err != nil {
			return
		}
		if len(names) == 0 || !strings.HasPrefix(strings.TrimSpace(line), "restart") {
			t.Fatalf("accepted %q as %v", line, names)
		}
		last := -1
		for _, n := range names {
			i := slices.Index(components.Names, n)
			if i <= last {
				t.Fatalf("%q: %v is not components in start order, each once", line, names)
			}
			last = i
		}
	})
}

func TestParseRestartRequest(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
		err  string
	}{
		{"restart kube-scheduler etcd\n", []string{components.Etcd, components.Scheduler}, ""},
		{"restart etcd kube-apiserver kube-controller-manager kube-scheduler", components.Names, ""},
		{"restart", nil, `want "restart" followed by component names`},
		{"stop etcd", nil, `want "restart"`},
		{"restart etcd etcd", nil, `component "etcd" named twice`},
		{"restart kubelet", nil, `unknown component "kubelet"; the components are etcd, kube-apiserver`},
	} {
		got, err := parseRestartRequest(tc.line)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v %v, want error %q", tc.line, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v %v, want %v", tc.line, got, err, tc.want)
		}
	}
}

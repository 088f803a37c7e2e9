package enroll

import (
	"slices"
	"testing"
)

// TestAPIServers: a bundle's api_servers are the enroller kubeconfig's endpoint as
// HOST:PORT first, then cluster.apiServers, each once.
func TestAPIServers(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		others   []string
		want     []string
	}{
		{"https://10.0.0.2:6443", nil, []string{"10.0.0.2:6443"}},
		{"https://10.0.0.2:6443", []string{"10.0.0.3:6443", "10.0.0.2:6443", "10.0.0.4:6443"}, []string{"10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443"}},
		{"https://[fd00::2]:6443", []string{"[fd00::3]:6443"}, []string{"[fd00::2]:6443", "[fd00::3]:6443"}},
		{"", []string{"10.0.0.3:6443"}, []string{"10.0.0.3:6443"}},
	} {
		if got := apiServers(tc.endpoint, tc.others); !slices.Equal(got, tc.want) {
			t.Errorf("apiServers(%q, %v) = %v; want %v", tc.endpoint, tc.others, got, tc.want)
		}
	}
}

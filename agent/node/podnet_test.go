package node

import (
	"strings"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

// TestPodNetworkSettings: the JoinBundle's pod network (gpuboot's cluster.podNetwork)
// wins field by field over the profile's, which wins over the defaults; a bundle value
// that is not valid is an error naming gpuboot's setting, not a silent fallback.
func TestPodNetworkSettings(t *testing.T) {
	gw := &profile.Profile{Kubernetes: profile.Kubernetes{PodNetwork: &profile.PodNetwork{Backend: "host-gw", PodSubnet: "10.50.0.0/16"}}}
	cases := []struct {
		name    string
		prof    *profile.Profile
		bundle  *bootv1.PodNetwork
		want    profile.PodNetwork
		wantErr string
	}{
		{"defaults", nil, nil, profile.PodNetwork{Backend: "vxlan", PodSubnet: "10.244.0.0/16"}, ""},
		{"profile", gw, nil, profile.PodNetwork{Backend: "host-gw", PodSubnet: "10.50.0.0/16"}, ""},
		{"bundle backend only", gw, &bootv1.PodNetwork{Backend: "vxlan"}, profile.PodNetwork{Backend: "vxlan", PodSubnet: "10.50.0.0/16"}, ""},
		{"bundle both", nil, &bootv1.PodNetwork{Backend: "host-gw", Subnet: "10.60.0.0/16"}, profile.PodNetwork{Backend: "host-gw", PodSubnet: "10.60.0.0/16"}, ""},
		{"bad backend", nil, &bootv1.PodNetwork{Backend: "weave"}, profile.PodNetwork{}, `backend "weave" is not vxlan or host-gw (gpuboot's cluster.podNetwork.backend)`},
		{"bad subnet", nil, &bootv1.PodNetwork{Subnet: "10.60.1.0/16"}, profile.PodNetwork{}, `subnet "10.60.1.0/16" is not a network in CIDR form`},
	}
	for _, c := range cases {
		n := &node{cfg: Config{Profile: c.prof}}
		got, err := n.podNetworkSettings(&bootv1.JoinBundle{PodNetwork: c.bundle})
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.wantErr)
			}
		case err != nil || got != c.want:
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

package controlplane_test

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

// TestStatusVIPHolderUnknown: status of a control plane with apiServer.vip whose vip
// component is not running reports the address with the holder unknown and why,
// without failing; without a VIP it reports none. Nothing runs: a written directory.
func TestStatusVIPHolderUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // a port nothing listens on: the holder is not running
	for _, tc := range []struct {
		name, yaml string
		vip        bool
	}{
		{"no vip", "", false},
		{"vip", fmt.Sprintf("apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: 0.0.0.0\n  vip: {address: 10.0.0.10/24, interface: eth0, healthPort: %d}\n", port), true},
	} {
		l := components.Layout{Dir: t.TempDir()}
		cfg, err := clusterconfig.Parse("cluster.yaml", []byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(l.ConfigFile(), []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := clusterpki.Ensure(l.PKIDir(), cfg); err != nil {
			t.Fatal(err)
		}
		st, err := controlplane.GetStatus(ctxFor(t, time.Minute), l.Dir)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !tc.vip {
			if st.VIP != nil {
				t.Errorf("%s: VIP status %+v", tc.name, st.VIP)
			}
			continue
		}
		if st.VIP == nil || st.VIP.Address != "10.0.0.10/24" || st.VIP.Holder != "" || !strings.Contains(st.VIP.Err, "not listening") {
			t.Errorf("%s: VIP status %+v, want the address with the holder unknown because the vip does not listen", tc.name, st.VIP)
		}
		if len(st.Components) != 5 || st.Components[4].Name != components.VIP {
			t.Errorf("%s: components %+v, want the four and the vip", tc.name, st.Components)
		}
	}
}

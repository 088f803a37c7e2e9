package dhcp

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func counterOf(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestHandleCountsRepliesByKind: Handle labels each reply with the boot stage the
// decision classified, and each ignored request with its reason.
func TestHandleCountsRepliesByKind(t *testing.T) {
	s := &Server{Config: proxyConfig(), Log: slog.New(slog.DiscardHandler)}
	src := netip.MustParseAddrPort("10.88.0.77:68")
	for _, tc := range []struct {
		name string
		req  *dhcpv4.DHCPv4
		kind ClientKind
	}{
		{"BIOS PXE", request(t, dhcpv4.MessageTypeDiscover, pxe(0)...), KindBIOS},
		{"UEFI PXE", request(t, dhcpv4.MessageTypeDiscover, pxe(7)...), KindEFI},
		{"UEFI HTTP", request(t, dhcpv4.MessageTypeDiscover, pxe(16)...), KindHTTP},
		{"iPXE", request(t, dhcpv4.MessageTypeDiscover, append(pxe(7), dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))...), KindIPXE},
	} {
		reply, _, reason := s.Handle(tc.req.ToBytes(), src, 67)
		if reply == nil {
			t.Fatalf("%s: ignored (%s)", tc.name, reason)
		}
		if got := counterOf(t, s.Metrics.Replies.WithLabelValues("offer", string(tc.kind), "67")); got != 1 {
			t.Errorf("%s: replies{type=offer,client=%s,port=67} = %v; want 1", tc.name, tc.kind, got)
		}
	}
	if reply, _, reason := s.Handle(request(t, dhcpv4.MessageTypeDiscover, pxe(iana.Arch(11))...).ToBytes(), src, 67); reply != nil || reason != ReasonUnsupportedArch {
		t.Fatalf("ARM64 PXE: %v, %s; want ignored as %s", reply, reason, ReasonUnsupportedArch)
	}
	if got := counterOf(t, s.Metrics.Ignores.WithLabelValues(string(ReasonUnsupportedArch))); got != 1 {
		t.Errorf("ignored{reason=%s} = %v; want 1", ReasonUnsupportedArch, got)
	}
}

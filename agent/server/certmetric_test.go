package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/internal/profile"
)

// TestCertificateExpiryMetric: the agent certificate's NotAfter is exported as
// gpurack_certificate_expiry_timestamp_seconds{component="gpuagent",name="agent"}, the
// value follows a renewal, and nothing is exported before the agent has a certificate.
func TestCertificateExpiryMetric(t *testing.T) {
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "cert"})
	if err != nil {
		t.Fatal(err)
	}
	var notAfter time.Time
	c := &Collector{Monitor: monitor.New(monitor.Config{Backend: s, Profile: p}), Hostname: "gpu-r1-u07",
		CertificateNotAfter: func() time.Time { return notAfter }}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	const name = "gpurack_certificate_expiry_timestamp_seconds"
	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 0 {
		t.Fatalf("without a certificate: %d series, %v; want none", n, err)
	}
	for _, at := range []int64{1767225600, 1798761600} { // first certificate, then the renewed one
		notAfter = time.Unix(at, 0)
		want := `
# HELP gpurack_certificate_expiry_timestamp_seconds When a certificate expires (its NotAfter), seconds since the epoch; component gpuagent, name agent: the agent certificate in use.
# TYPE gpurack_certificate_expiry_timestamp_seconds gauge
gpurack_certificate_expiry_timestamp_seconds{Hostname="gpu-r1-u07",component="gpuagent",name="agent"} ` + strconv.FormatInt(at, 10) + `
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
			t.Error(err)
		}
	}
}

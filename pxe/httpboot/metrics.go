package httpboot

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	bytes    *prometheus.CounterVec // label route: images, ipxe
	scripts  *prometheus.CounterVec // label result: identify, boot, hold, bad-request, error
	refusals *prometheus.CounterVec // label reason: unverified, not-found, bad-name
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_http_bytes_total", Help: "Bytes of file bodies sent over plain HTTP, by route.",
		}, []string{"route"}),
		scripts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_boot_scripts_total", Help: "iPXE scripts served at /boot.ipxe, by result.",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_http_refused_total", Help: "Image and iPXE file requests refused, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range []string{"images", "ipxe"} {
		m.bytes.WithLabelValues(r)
	}
	for _, r := range []string{"identify", "boot", "hold", "bad-request", "error"} {
		m.scripts.WithLabelValues(r)
	}
	for _, r := range []string{"unverified", "not-found", "bad-name"} {
		m.refusals.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.bytes, m.scripts, m.refusals} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("httpboot: register metrics (one handler per registry): %w", err)
		}
	}
	return m, nil
}

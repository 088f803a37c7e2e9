package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// inventoryCollector exports machines by state and the enrollment counters, read at
// scrape time.
type inventoryCollector struct {
	svc                                                *enroll.Service
	machines                                           inventory.Store
	byState, registrations, released, refused, limited *prometheus.Desc
}

func newInventoryCollector(svc *enroll.Service, machines inventory.Store) *inventoryCollector {
	return &inventoryCollector{
		svc:           svc,
		machines:      machines,
		byState:       prometheus.NewDesc("gpuboot_machines", "Machines in the inventory by lifecycle state.", []string{"state"}, nil),
		registrations: prometheus.NewDesc("gpuboot_enroll_registrations_total", "Register calls by answer.", []string{"answer"}, nil),
		released:      prometheus.NewDesc("gpuboot_enroll_bundles_released_total", "JoinBundles released.", nil, nil),
		refused:       prometheus.NewDesc("gpuboot_enroll_bundles_refused_total", "GetJoinBundle calls refused, by gRPC code.", []string{"code"}, nil),
		limited:       prometheus.NewDesc("gpuboot_enroll_creations_limited_total", "New machine records refused by the bounds on unauthenticated traffic.", nil, nil),
	}
}

func (c *inventoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.byState
	ch <- c.registrations
	ch <- c.released
	ch <- c.refused
	ch <- c.limited
}

func (c *inventoryCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[inventory.State]int{}
	if all, err := c.machines.List(context.Background()); err == nil {
		for _, m := range all {
			counts[m.State]++
		}
	}
	for _, st := range inventory.States {
		ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
	regs, released, refused, limited := c.svc.Snapshot()
	for a, n := range regs {
		ch <- prometheus.MustNewConstMetric(c.registrations, prometheus.CounterValue, float64(n), a)
	}
	ch <- prometheus.MustNewConstMetric(c.released, prometheus.CounterValue, float64(released))
	for code, n := range refused {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n), code)
	}
	ch <- prometheus.MustNewConstMetric(c.limited, prometheus.CounterValue, float64(limited))
}

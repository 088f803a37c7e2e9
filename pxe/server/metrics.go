package server

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// machineClass is what gpuboot_machines counts by: the lifecycle state, and whether the
// machine's latest checklist came from the GPU simulator (CONTRACTS §11: a simulated
// machine is never counted as a real one).
type machineClass struct {
	state     inventory.State
	simulated bool
}

func classOf(m *inventory.Machine) machineClass {
	return machineClass{m.State, checklistSimulated(m.Checklist)}
}

// checklistSimulated reads Checklist.simulated (field 11, machine.proto) from an encoded
// checklist without decoding the rest: a heartbeat's write must not cost a full decode.
// A malformed checklist reads as not simulated (gpuboot stores only ones it decoded).
func checklistSimulated(b []byte) bool {
	simulated := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 11 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			simulated = v != 0 // the last occurrence wins, as in proto.Unmarshal
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return simulated
}

// countingStore is an inventory.Store that keeps the number of machines in each
// lifecycle state (and simulated or not) as writes commit, so that a /metrics scrape (plain HTTP, anyone on
// the provisioning network) reads a few integers instead of decoding every machine.
// It counts once from the store at start; after that every Create and Update of
// gpuboot goes through it (no other writer holds the file: bbolt locks it).
type countingStore struct {
	inventory.Store

	mu     sync.Mutex
	counts map[machineClass]int
}

// newCountingStore wraps s and counts its machines by state (one full read).
func newCountingStore(ctx context.Context, s inventory.Store) (*countingStore, error) {
	all, err := s.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("count machines by state: %w", err)
	}
	c := &countingStore{Store: s, counts: map[machineClass]int{}}
	for _, m := range all {
		c.counts[classOf(m)]++
	}
	return c, nil
}

// Create implements inventory.Store.
func (c *countingStore) Create(ctx context.Context, m *inventory.Machine, ts ...inventory.Transition) error {
	if err := c.Store.Create(ctx, m, ts...); err != nil {
		return err
	}
	c.move(machineClass{state: inventory.None}, classOf(m))
	return nil
}

// Update implements inventory.Store. The state the machine had is read in the same
// transaction as the write (the copy fn receives), so concurrent updates of one
// machine each count their own move.
func (c *countingStore) Update(ctx context.Context, id string, fn func(*inventory.Machine) ([]inventory.Transition, error)) (*inventory.Machine, error) {
	var from machineClass
	m, err := c.Store.Update(ctx, id, func(m *inventory.Machine) ([]inventory.Transition, error) {
		from = classOf(m)
		return fn(m)
	})
	if err != nil {
		return m, err
	}
	c.move(from, classOf(m))
	return m, nil
}

func (c *countingStore) move(from, to machineClass) {
	if from == to {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if from.state != inventory.None {
		c.counts[from]--
	}
	c.counts[to]++
}

// recount replaces the counts with a full read of the store. A store other gpuboot
// replicas write (kubestore) changes behind this one's back, so it is recounted
// every recountEvery.
func (c *countingStore) recount(ctx context.Context) error {
	all, err := c.Store.List(ctx)
	if err != nil {
		return fmt.Errorf("count machines by state: %w", err)
	}
	counts := map[machineClass]int{}
	for _, m := range all {
		counts[classOf(m)]++
	}
	c.mu.Lock()
	c.counts = counts
	c.mu.Unlock()
	return nil
}

// recountEvery is how often a shared store's counts are read again.
const recountEvery = 30 * time.Second

// byClass returns a copy of the counts.
func (c *countingStore) byClass() map[machineClass]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[machineClass]int, len(c.counts))
	for k, n := range c.counts {
		out[k] = n
	}
	return out
}

// inventoryCollector exports machines by state (kept by a countingStore) and the
// enrollment counters; a scrape reads no machine record.
type inventoryCollector struct {
	svc                                                *enroll.Service
	counts                                             func() map[machineClass]int
	byState, registrations, released, refused, limited *prometheus.Desc
}

func newInventoryCollector(svc *enroll.Service, counts func() map[machineClass]int) *inventoryCollector {
	return &inventoryCollector{
		svc:           svc,
		counts:        counts,
		byState:       prometheus.NewDesc("gpuboot_machines", "Machines in the inventory by lifecycle state; simulated=\"true\" for those whose latest checklist came from the GPU simulator.", []string{"state", "simulated"}, nil),
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
	counts := c.counts()
	for _, st := range inventory.States {
		for _, sim := range []bool{false, true} {
			ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(counts[machineClass{st, sim}]), string(st), strconv.FormatBool(sim))
		}
	}
	if c.svc == nil {
		return
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

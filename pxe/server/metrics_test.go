package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// listCounter counts List calls on the store below it.
type listCounter struct {
	inventory.Store
	mu    sync.Mutex
	lists int
}

func (l *listCounter) List(ctx context.Context) ([]*inventory.Machine, error) {
	l.mu.Lock()
	l.lists++
	l.mu.Unlock()
	return l.Store.List(ctx)
}

// scanByState is what a scrape did before: decode every machine and count.
func scanByState(t testing.TB, s inventory.Store) map[inventory.State]int {
	all, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[inventory.State]int{}
	for _, m := range all {
		out[m.State]++
	}
	return out
}

func openBolt(t testing.TB) *inventory.BoltStore {
	s, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newMachine(i int, facts []byte) *inventory.Machine {
	return &inventory.Machine{ID: fmt.Sprintf("m%06d", i), Facts: facts,
		Identity: identity.Identity{MAC: fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff), Serial: fmt.Sprintf("SN-%06d", i)}}
}

func createMachine(t testing.TB, s inventory.Store, i int, facts []byte) {
	m := newMachine(i, facts)
	tr, err := inventory.Move(m, inventory.Discovered, "gpuboot", "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Create(context.Background(), m, tr); err != nil {
		t.Fatal(err)
	}
}

// TestMachinesByStateIncremental drives machines through the lifecycle (random legal
// moves, concurrently, with illegal moves and failing updates mixed in) and checks
// after each round that the gauge equals a full scan of the store, and that scrapes
// read no machine record.
func TestMachinesByStateIncremental(t *testing.T) {
	ctx := context.Background()
	lc := &listCounter{Store: openBolt(t)}
	for i := range 20 { // machines recorded before gpuboot starts
		createMachine(t, lc, i, nil)
	}
	store, err := newCountingStore(ctx, lc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newInventoryCollector(nil, store.byState))
	listsAtStart := lc.lists

	check := func(round int) {
		t.Helper()
		want := scanByState(t, lc)
		for _, st := range inventory.States {
			got := gaugeValue(t, reg, st)
			if int(got) != want[st] {
				t.Fatalf("round %d: gpuboot_machines{state=%q} = %v, a full scan counts %d", round, st, got, want[st])
			}
		}
	}
	check(0)
	n := 20
	for round := 1; round <= 15; round++ {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for range 6 {
					id := fmt.Sprintf("m%06d", r.IntN(n))
					_, _ = store.Update(ctx, id, func(m *inventory.Machine) ([]inventory.Transition, error) {
						switch r.IntN(10) {
						case 0: // an illegal move: the store refuses it
							m.State = inventory.Ready
							return nil, nil
						case 1: // the caller gives up
							return nil, fmt.Errorf("changed my mind")
						}
						next := legalMoves(m.State)
						if len(next) == 0 {
							return nil, nil
						}
						tr, err := inventory.Move(m, next[r.IntN(len(next))], "gpuboot", "test", time.Now())
						if err != nil {
							return nil, err
						}
						return []inventory.Transition{tr}, nil
					})
				}
			}()
		}
		createMachine(t, store, n, nil)
		n++
		wg.Wait()
		check(round)
	}
	if lc.lists != listsAtStart+16 { // only check's own scans
		t.Fatalf("scrapes listed the store %d times", lc.lists-listsAtStart-16)
	}
}

// legalMoves lists the states a machine in st may move to.
func legalMoves(st inventory.State) []inventory.State {
	var out []inventory.State
	for _, to := range inventory.States {
		if inventory.Allowed(st, to) {
			out = append(out, to)
		}
	}
	return out
}

// gaugeValue gathers reg and returns gpuboot_machines{state=st}.
func gaugeValue(t testing.TB, reg *prometheus.Registry, st inventory.State) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpuboot_machines" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == string(st) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no gpuboot_machines{state=%q}", st)
	return 0
}

// scanCollector is the collector as it was: it lists the inventory on every scrape.
type scanCollector struct {
	s    inventory.Store
	desc *prometheus.Desc
}

func (c *scanCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *scanCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[inventory.State]int{}
	if all, err := c.s.List(context.Background()); err == nil {
		for _, m := range all {
			counts[m.State]++
		}
	}
	for _, st := range inventory.States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
}

// BenchmarkScrapeMachinesByState compares a /metrics scrape of the machines gauge
// as it was (scan: decode every record) with the kept counts (incremental). Records
// carry 4 KiB of facts, about what a real 8-GPU machine sends; bbolt file in the
// test's temporary directory, warm page cache.
func BenchmarkScrapeMachinesByState(b *testing.B) {
	facts := []byte(strings.Repeat("f", 4<<10))
	for _, n := range []int{1000, 10000} {
		bolt := openBolt(b)
		for i := range n {
			createMachine(b, bolt, i, facts)
		}
		store, err := newCountingStore(context.Background(), bolt)
		if err != nil {
			b.Fatal(err)
		}
		for name, c := range map[string]prometheus.Collector{
			"scan":        &scanCollector{s: bolt, desc: prometheus.NewDesc("gpuboot_machines", "h", []string{"state"}, nil)},
			"incremental": newInventoryCollector(nil, store.byState),
		} {
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			b.Run(fmt.Sprintf("%s/machines=%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := reg.Gather(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

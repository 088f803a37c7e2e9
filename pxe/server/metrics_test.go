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
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	machinev1 "github.com/gpurack/gpurack/api/machine/v1"

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
// scanByClass counts the store's machines by state and simulated, decoding each
// checklist in full (what the incremental count must agree with).
func scanByClass(t testing.TB, s inventory.Store) map[machineClass]int {
	all, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[machineClass]int{}
	for _, m := range all {
		cl := new(machinev1.Checklist)
		if err := proto.Unmarshal(m.Checklist, cl); err != nil {
			t.Fatal(err)
		}
		out[machineClass{m.State, cl.GetSimulated()}]++
	}
	return out
}

// checklistBytes is an encoded checklist with a result, simulated or not.
func checklistBytes(simulated bool) []byte {
	b, _ := proto.Marshal(&machinev1.Checklist{ImageId: "img", Simulated: simulated, DriverVersion: "580.1",
		Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS}}})
	return b
}

func TestChecklistSimulated(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"simulated", checklistBytes(true), true},
		{"real", checklistBytes(false), false},
		{"none", nil, false},
		{"truncated", checklistBytes(true)[:5], false},
		{"the last occurrence wins", append(checklistBytes(true), protowire.AppendVarint(protowire.AppendTag(nil, 11, protowire.VarintType), 0)...), false},
	} {
		if got := checklistSimulated(tt.b); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
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
	reg.MustRegister(newInventoryCollector(nil, store.byClass))
	listsAtStart := lc.lists

	check := func(round int) {
		t.Helper()
		want := scanByClass(t, lc)
		for _, st := range inventory.States {
			for _, sim := range []bool{false, true} {
				got := gaugeValue(t, reg, st, sim)
				if int(got) != want[machineClass{st, sim}] {
					t.Fatalf("round %d: gpuboot_machines{state=%q,simulated=%v} = %v, a full scan counts %d", round, st, sim, got, want[machineClass{st, sim}])
				}
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
						case 2, 3: // a new checklist, simulated or not, and no move
							m.Checklist = checklistBytes(r.IntN(2) == 0)
							return nil, nil
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

// gaugeValue gathers reg and returns gpuboot_machines{state=st,simulated=sim}.
func gaugeValue(t testing.TB, reg *prometheus.Registry, st inventory.State, sim bool) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpuboot_machines" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["state"] == string(st) && labels["simulated"] == fmt.Sprint(sim) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no gpuboot_machines{state=%q,simulated=%v}", st, sim)
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
			"incremental": newInventoryCollector(nil, store.byClass),
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

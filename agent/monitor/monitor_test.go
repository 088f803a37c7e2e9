package monitor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/xid"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
)

func newMon(t *testing.T, clearAfter time.Duration) (*Monitor, *sim.Sim) {
	t.Helper()
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version})
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Backend: s, Profile: p, Interval: 50 * time.Millisecond, ClearAfter: clearAfter}), s
}

func inject(t *testing.T, s *sim.Sim, spec string) {
	t.Helper()
	f, err := sim.ParseFault(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inject(f, 0); err != nil {
		t.Fatal(err)
	}
}

func TestLostGPUIsXID79UntilReset(t *testing.T) {
	m, s := newMon(t, -1)
	sub := m.Broker().Subscribe()
	defer sub.Close()
	if cl := m.RunChecks(PhaseContinuous); cl.Overall != checks.NotApplicable && cl.Overall != checks.Pass {
		t.Fatalf("healthy overall %s", cl.Overall)
	}
	inject(t, s, "gpu-lost@gpu4")
	m.RunChecks(PhaseContinuous)
	// A lost GPU is withdrawn alone: the node keeps GPUHealthy True (decision 0630).
	h := m.Health()
	if h.State != health.Degraded || !h.GPUHealthy || len(h.UnhealthyGPUs) != 1 || h.UnhealthyGPUs[0] != 4 || !slices.Equal(h.WithdrawnGPUs(), []int{4}) {
		t.Fatalf("health after GPU lost: %+v", h)
	}
	ev := m.XIDs().Events(time.Now(), time.Hour)
	if len(ev) != 1 || ev[0].Code != 79 || ev[0].Source != "nvml-lost" || ev[0].PCIBusID == "" {
		t.Fatalf("XID history %+v", ev)
	}
	// Repeated reads of the lost GPU do not add XIDs.
	m.RunChecks(PhaseContinuous)
	if n := len(m.XIDs().Events(time.Now(), time.Hour)); n != 1 {
		t.Fatalf("%d XIDs after two reads", n)
	}
	s.Clear()
	m.RunChecks(PhaseContinuous)
	if !slices.Equal(m.Health().WithdrawnGPUs(), []int{4}) {
		t.Fatal("GPU 4 came back without a reset: the XID 79 still counts")
	}
	m.GPUsReset([]int{4})
	m.RunChecks(PhaseContinuous)
	if h := m.Health(); h.State != health.Healthy {
		t.Fatalf("after reset: %+v", h)
	}
	var kinds []string
	for len(sub.C) > 0 {
		e := <-sub.C
		switch {
		case e.Health != nil:
			kinds = append(kinds, "health:"+e.Health.Current.State.String())
		case e.XID != nil:
			kinds = append(kinds, "xid")
		}
	}
	// degraded twice: GPU 4 withdrawn with the lost GPU's other checks unknown, then
	// still withdrawn (the XID 79 counts until a reset) with them readable again.
	want := []string{"health:healthy", "xid", "health:degraded", "health:degraded", "health:healthy"}
	if len(kinds) != len(want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("events %v, want %v", kinds, want)
		}
	}
}

func TestRunReactsToXIDAtOnce(t *testing.T) {
	m, s := newMon(t, time.Hour)
	m.cfg.Interval = time.Hour // only the XID can trigger the second run
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	sub := m.Broker().Subscribe()
	defer sub.Close()
	deadline := time.After(20 * time.Second)
	for m.Last() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	// The event watch registers asynchronously; keep injecting until it hears one.
	f, _ := sim.ParseFault("xid:48@gpu1")
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case e := <-sub.C:
			if e.Health != nil && len(e.Health.Current.Withdrawn) > 0 {
				if c := e.Health.Current; c.Failing[0] != string(checkid.XIDFatal) || !slices.Equal(c.WithdrawnGPUs(), []int{1}) {
					t.Fatalf("failing %v withdrawn %v", c.Failing, c.WithdrawnGPUs())
				}
				return
			}
		case <-tick.C:
			s.Inject(f, 0)
		case <-deadline:
			t.Fatal("an XID from the NVML event set did not withdraw its GPU")
		}
	}
}

func TestBrokerDropsSlowSubscriber(t *testing.T) {
	b := NewBroker()
	slow := b.Subscribe()
	for i := 0; i < SubscriberBuffer+1; i++ {
		b.Publish(Event{Time: time.Unix(int64(i), 0)})
	}
	select {
	case <-slow.Overflowed:
	default:
		t.Fatal("subscriber not told it overflowed")
	}
	n := 0
	for range slow.C {
		n++
	}
	if n != SubscriberBuffer {
		t.Errorf("drained %d events", n)
	}
	slow.Close() // after overflow: no panic
}

// BenchmarkChecklist is one validate-style run: read 8 simulated GPUs, run every
// check.
func BenchmarkChecklist(b *testing.B) {
	p, _ := profile.Load("../../profiles/debian12-nvidia535.yaml")
	s, _ := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version})
	m := New(Config{Backend: s, Profile: p})
	for b.Loop() {
		m.RunChecks(PhaseCommissioning)
	}
}

// TestTicksReadSlowFieldsOnTheirPeriod: a continuous tick refreshes the fast fields
// (temperature) every time and the slow ones (row remapping) only once SlowInterval
// has passed since the last full read; a kick reads everything at once.
func TestTicksReadSlowFieldsOnTheirPeriod(t *testing.T) {
	m, s := newMon(t, -1)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m.cfg.Now = func() time.Time { return now }
	m.cfg.Interval, m.cfg.SlowInterval = 10*time.Second, time.Minute
	tick := func(d time.Duration) *Checklist { now = now.Add(d); return m.runChecks(PhaseContinuous, true) }
	status := func(cl *Checklist, id checkid.ID, gpu int) checks.Status {
		for _, r := range cl.Results {
			if r.ID == id && r.GPU == gpu {
				return r.Status
			}
		}
		t.Fatalf("no %s result for GPU %d", id, gpu)
		return 0
	}

	first := tick(0)
	if !first.Snapshot.SlowTakenAt.Equal(first.Snapshot.TakenAt) {
		t.Fatal("the first tick did not read the slow fields")
	}
	inject(t, s, "temperature:95@gpu3")
	inject(t, s, "row-remap-pending@gpu3")
	var cl *Checklist
	for i := 1; i <= 5; i++ { // 10 s … 50 s: fast reads
		cl = tick(10 * time.Second)
		g := cl.Snapshot.ByIndex(3)
		if g.TemperatureC.V != 95 {
			t.Fatalf("tick %d: temperature %v, want the injected 95 °C at once", i, g.TemperatureC)
		}
		if g.RowRemap.V.Pending || !cl.Snapshot.SlowTakenAt.Equal(first.Snapshot.SlowTakenAt) {
			t.Fatalf("tick %d (%v after the full read) refreshed the slow fields", i, time.Duration(i)*10*time.Second)
		}
	}
	if st := status(cl, checkid.RowRemapPending, 3); st != checks.Pass {
		t.Fatalf("row-remap-pending is %s before the slow period", st)
	}
	cl = tick(10 * time.Second) // 60 s: the slow period is over
	if !cl.Snapshot.ByIndex(3).RowRemap.V.Pending || !cl.Snapshot.SlowTakenAt.Equal(cl.Snapshot.TakenAt) {
		t.Fatal("the tick one SlowInterval after the full read did not read the slow fields")
	}
	if st := status(cl, checkid.RowRemapPending, 3); st == checks.Pass {
		t.Fatalf("row-remap-pending still passes after the full read")
	}

	// A kick (fault injection, XID, NVML event) reads everything at once.
	s.Clear()
	inject(t, s, "row-remap-failed@gpu5")
	if cl = tick(10 * time.Second); cl.Snapshot.ByIndex(5).RowRemap.V.Failed {
		t.Fatal("a fast tick read the row remapping")
	}
	now = now.Add(time.Second)
	if cl = m.runChecks(PhaseContinuous, false); !cl.Snapshot.ByIndex(5).RowRemap.V.Failed {
		t.Fatal("a kicked run did not read the slow fields")
	}
}

func TestReadTier(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := &gpu.Snapshot{}
	for _, c := range []struct {
		name     string
		kicked   bool
		prev     *gpu.Snapshot
		lastFull time.Time
		now      time.Time
		want     gpu.Tier
	}{
		{"first run", false, nil, time.Time{}, t0, gpu.Full},
		{"tick within the period", false, prev, t0, t0.Add(59 * time.Second), gpu.Fast},
		{"tick at the period", false, prev, t0, t0.Add(time.Minute), gpu.Full},
		{"kick within the period", true, prev, t0, t0.Add(time.Second), gpu.Full},
		{"no full read yet", false, prev, time.Time{}, t0, gpu.Full},
	} {
		if got := readTier(c.kicked, c.prev, c.lastFull, c.now, time.Minute); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// notSimulated is the simulator claiming to be real hardware, to show the checklist's
// Simulated flag follows the backend's word and nothing else.
type notSimulated struct{ *sim.Sim }

func (notSimulated) Simulated() bool { return false }

// TestChecklistSaysSimulated: a checklist run on the simulator backend is marked
// simulated (CONTRACTS §11), and the proto the agent sends gpuboot carries it.
func TestChecklistSaysSimulated(t *testing.T) {
	m, s := newMon(t, time.Second)
	cl := m.RunChecks(PhaseCommissioning)
	if !cl.Simulated {
		t.Fatal("checklist from the simulator backend not marked simulated")
	}
	hw := New(Config{Backend: notSimulated{s}, Profile: m.cfg.Profile})
	if cl := hw.RunChecks(PhaseCommissioning); cl.Simulated {
		t.Fatal("checklist from a backend that is not simulated marked simulated")
	}
}

// TestProfileXIDWithdraw: gpu.xid.withdraw decides which XIDs withdraw a GPU. With
// [79, 92], a (recoverable-class) XID 92 withdraws its GPU until a reset, and an XID 48
// (reset-gpu class, withdrawn by default) only warns through gpu.xid.recent.
func TestProfileXIDWithdraw(t *testing.T) {
	m, _ := newMon(t, -1)
	m.cfg.Profile.GPU.XID = &profile.XIDPolicy{Withdraw: []uint32{79, 92}}
	m.cfg.ClearAfter = -1 // New made it 0, which a second New would read as the default
	m = New(m.cfg)
	m.RunChecks(PhaseContinuous)
	for _, code := range []uint32{92, 48} {
		g := map[uint32]int{92: 1, 48: 2}[code]
		m.RecordXID(xid.Event{GPU: g, Code: code, At: time.Now(), Source: "sim"}, 0)
	}
	m.RunChecks(PhaseContinuous)
	h := m.Health()
	if !slices.Equal(h.WithdrawnGPUs(), []int{1}) || !h.GPUHealthy || !slices.Contains(h.Warning, string(checkid.XIDRecent)) {
		t.Fatalf("with withdraw [79 92]: withdrawn %v GPUHealthy %v warning %v; want GPU 1 withdrawn, XID 48 only warning", h.WithdrawnGPUs(), h.GPUHealthy, h.Warning)
	}
	// The default classification: XID 48 withdraws, XID 92 warns.
	d, _ := newMon(t, -1)
	d.RunChecks(PhaseContinuous)
	d.RecordXID(xid.Event{GPU: 2, Code: 48, At: time.Now(), Source: "sim"}, 0)
	d.RecordXID(xid.Event{GPU: 1, Code: 92, At: time.Now(), Source: "sim"}, 0)
	d.RunChecks(PhaseContinuous)
	if h := d.Health(); !slices.Equal(h.WithdrawnGPUs(), []int{2}) {
		t.Fatalf("default classification: withdrawn %v, want [2]", h.WithdrawnGPUs())
	}
	// After a reset GPU 1's XID 92 no longer counts, though it is inside the 2 h window.
	m.GPUsReset([]int{1})
	m.RunChecks(PhaseContinuous)
	if h := m.Health(); len(h.Withdrawn) != 0 {
		t.Fatalf("after resetting GPU 1: withdrawn %v", h.WithdrawnGPUs())
	}
}

// Package monitor is the agent's core: it reads the GPU backend into snapshots, runs
// the checklist (once for `gpuagent validate`, periodically and on every XID for
// `gpuagent run`), keeps the XID history and the health summary with hysteresis, and
// publishes what changed to subscribers (the gRPC WatchEvents stream, gossip, metrics).
//
// It owns no sockets: servers read its state and subscribe to its events.
package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/gpucompute"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/xid"
	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/xidclass"
)

// Phase records why a checklist ran (gpurack.machine.v1.CheckPhase).
type Phase int

// The phases.
const (
	PhaseContinuous Phase = iota
	PhasePreApproval
	PhaseCommissioning
)

// Checklist is one completed run.
type Checklist struct {
	Phase      Phase
	StartedAt  time.Time
	FinishedAt time.Time
	Results    []checks.Result
	Overall    checks.Status
	Snapshot   gpu.Snapshot
	Profile    string
	// Simulated is true when the backend is the simulator (gpu.Backend.Simulated).
	Simulated bool
}

// Config configures a Monitor.
type Config struct {
	Backend gpu.Backend
	Profile *profile.Profile
	Log     *slog.Logger
	// Interval between continuous runs; default 10 s. Each tick reads the fast GPU
	// fields (gpu.Fast); see SlowInterval.
	Interval time.Duration
	// SlowInterval is how often a tick reads the slow-changing fields too (a full
	// read: identity, VBIOS, InfoROM, ECC aggregate counters, row remapping, retired
	// pages, PCIe maximum link, NVLink; gpu.Tier); default 5 min. XIDs, other NVML
	// events, kicks and RunChecks always read in full, so a fault the driver reports
	// is seen at once; the period bounds how late a silent change is seen.
	SlowInterval time.Duration
	// ClearAfter is the health hysteresis; default 30 s.
	ClearAfter time.Duration
	// KmsgPath, when set, is read for NVRM Xid lines (/dev/kmsg).
	KmsgPath string
	// Peers returns the rack peers' figures (from gossip); nil: none.
	Peers func() []checks.Peer
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Compute runs the compute check (agent/gpucompute) on the snapshot's GPUs; it is
	// called by commissioning runs when the profile turns gpu.compute on, and later
	// runs judge its last report. nil: never measured.
	Compute func(*gpu.Snapshot) *gpucompute.Report
}

// Monitor runs checks and tracks health. Its methods are safe for concurrent use.
type Monitor struct {
	cfg    Config
	log    *slog.Logger
	reader *gpu.Reader
	xids   *xid.Tracker
	broker *Broker
	kick   chan struct{}
	// withdraws says which XIDs withdraw their GPU (gpu.xid.withdraw).
	withdraws func(code uint32) bool

	runMu sync.Mutex // one checklist at a time

	mu       sync.Mutex
	last     *Checklist
	prev     *gpu.Snapshot
	lastFull time.Time // monitor clock (cfg.Now) of the last full read
	health   health.Tracker
	summary  health.Summary
	byKey    map[resultKey]checks.Result
	figures  checks.Figures
	uuids    map[int]string // last known UUID and bus id per index, for lost GPUs
	compute  *gpucompute.Report
	buses    map[int]string
}

type resultKey struct {
	id  checkid.ID
	gpu int
}

// New returns a Monitor; call Run for continuous checking or RunChecks once.
func New(cfg Config) *Monitor {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.SlowInterval <= 0 {
		cfg.SlowInterval = 5 * time.Minute
	}
	if cfg.ClearAfter < 0 {
		cfg.ClearAfter = 0
	} else if cfg.ClearAfter == 0 {
		cfg.ClearAfter = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{cfg: cfg, log: cfg.Log, reader: gpu.NewReader(cfg.Backend), xids: xid.NewTracker(), broker: NewBroker(), kick: make(chan struct{}, 1),
		byKey: map[resultKey]checks.Result{}, uuids: map[int]string{}, buses: map[int]string{}}
	m.health.ClearAfter = cfg.ClearAfter
	var list []uint32 // nil: the default classification
	if cfg.Profile != nil && cfg.Profile.GPU != nil {
		list = cfg.Profile.GPU.WithdrawXIDs()
	}
	m.withdraws = xidclass.Withdraws(list)
	m.summary = health.NotRun(cfg.Now())
	m.figures = checks.FiguresOf(&checks.Input{})
	return m
}

// Broker is where events are published.
func (m *Monitor) Broker() *Broker { return m.broker }

// XIDs is the XID history.
func (m *Monitor) XIDs() *xid.Tracker { return m.xids }

// Backend is the GPU backend.
func (m *Monitor) Backend() gpu.Backend { return m.cfg.Backend }

// Profile is the loaded profile.
func (m *Monitor) Profile() *profile.Profile { return m.cfg.Profile }

// Health returns the published health summary.
func (m *Monitor) Health() health.Summary {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.summary
}

// Figures returns this node's comparable figures from the latest full run (NaN
// where unknown).
func (m *Monitor) Figures() checks.Figures {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.figures
}

// Last returns the latest checklist, or nil.
func (m *Monitor) Last() *Checklist {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// Kick asks the loop to run the checklist now.
func (m *Monitor) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// RunChecks reads every field of the backend (a full read) and runs the checks named
// by ids (all when empty). A whole continuous checklist updates health; every run
// replaces the latest results.
func (m *Monitor) RunChecks(phase Phase, ids ...checkid.ID) *Checklist {
	return m.runChecks(phase, false, ids...)
}

// computeFor runs the compute check for a commissioning run when the profile turns it
// on and the agent wires it (Config.Compute); every other run judges the last report.
func (m *Monitor) computeFor(phase Phase, snap *gpu.Snapshot) *gpucompute.Report {
	m.mu.Lock()
	last := m.compute
	m.mu.Unlock()
	if phase != PhaseCommissioning || m.cfg.Compute == nil || m.cfg.Profile == nil ||
		!m.cfg.Profile.GPU.ComputeEnabled() || !snap.Driver.Loaded {
		return last
	}
	r := m.cfg.Compute(snap)
	m.mu.Lock()
	m.compute = r
	m.mu.Unlock()
	return r
}

// readTier decides what a continuous run reads: everything when asked (kicks, XIDs,
// NVML events), when there is no earlier snapshot, or when the slow fields are
// SlowInterval old; otherwise only the fast fields.
func readTier(kicked bool, prev *gpu.Snapshot, lastFull, now time.Time, slow time.Duration) gpu.Tier {
	if kicked || prev == nil || lastFull.IsZero() || now.Sub(lastFull) >= slow {
		return gpu.Full
	}
	return gpu.Fast
}

// runChecks is RunChecks; tick is true for a timer tick of the continuous loop, the
// only run that may read just the fast fields.
func (m *Monitor) runChecks(phase Phase, tick bool, ids ...checkid.ID) *Checklist {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	start := m.cfg.Now()
	m.mu.Lock()
	prev, lastFull := m.prev, m.lastFull
	m.mu.Unlock()
	tier := readTier(!tick, prev, lastFull, start, m.cfg.SlowInterval)
	snap := m.reader.Read(tier, prev)
	m.noteLost(&snap)
	if snap.SlowTakenAt.Equal(snap.TakenAt) {
		lastFull = start // a fast read may have fallen back to a full one
	}
	cphase := checks.Continuous
	if phase != PhaseContinuous {
		cphase = checks.Commissioning
	}
	in := &checks.Input{Snapshot: &snap, Previous: prev, Profile: m.cfg.Profile, Phase: cphase,
		XIDs: m.checkXIDs(start), Now: start, Compute: m.computeFor(phase, &snap)}
	if m.cfg.Peers != nil {
		in.Peers = m.cfg.Peers()
	}
	rs := checks.Run(in, ids...)
	cl := &Checklist{Phase: phase, StartedAt: start, FinishedAt: m.cfg.Now(), Results: rs,
		Overall: checks.Overall(rs), Snapshot: snap, Simulated: m.cfg.Backend.Simulated()}
	if m.cfg.Profile != nil {
		cl.Profile = m.cfg.Profile.Name
	}

	var events []Event
	m.mu.Lock()
	if snap.Driver.Loaded {
		m.prev = &snap
		m.lastFull = lastFull
	}
	m.last = cl
	for _, r := range rs {
		k := resultKey{r.ID, r.GPU}
		old, seen := m.byKey[k]
		if !seen || old.Status != r.Status {
			ev := Event{Time: cl.FinishedAt, Check: &CheckChange{Current: r}}
			if seen {
				o := old
				ev.Check.Previous = &o
			}
			events = append(events, ev)
		}
		m.byKey[k] = r
	}
	if len(ids) == 0 && snap.Driver.Loaded {
		m.figures = checks.FiguresOf(in)
	}
	if len(ids) == 0 {
		raw := health.Summarize(rs, len(snap.GPUs), cl.FinishedAt)
		if !snap.Driver.Loaded {
			raw.GPUCount = 0
		}
		prevSum := m.summary
		if s, changed := m.health.Update(raw); changed {
			m.summary = s
			p := prevSum
			events = append(events, Event{Time: cl.FinishedAt, Health: &HealthChange{Previous: &p, Current: s}})
		}
	}
	m.mu.Unlock()
	for _, e := range events {
		m.broker.Publish(e)
	}
	return cl
}

// noteLost fills identity of lost GPUs from earlier reads and records each loss as
// XID 79 (DCGM: NVML itself cannot report XID 79).
func (m *Monitor) noteLost(s *gpu.Snapshot) {
	m.mu.Lock()
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if g.UUID != "" {
			m.uuids[g.Index], m.buses[g.Index] = g.UUID, g.PCIBusID
		} else {
			g.UUID, g.PCIBusID = m.uuids[g.Index], m.buses[g.Index]
		}
	}
	m.mu.Unlock()
	for _, g := range s.GPUs {
		if g.Lost {
			m.RecordXID(xid.Event{GPU: g.Index, PCIBusID: g.PCIBusID, Code: 79, At: s.TakenAt, Source: "nvml-lost",
				Message: "ERROR_GPU_IS_LOST", Simulated: s.Simulated}, 0)
		}
	}
}

// checkXIDs are the XIDs the checks judge; Fatal (counted by gpu.xid.fatal, so the GPU
// is withdrawn) follows the profile's gpu.xid.withdraw (decision 0631).
func (m *Monitor) checkXIDs(now time.Time) []checks.XIDEvent {
	var out []checks.XIDEvent
	for _, e := range m.xids.EventsFor(now, checks.RecentXIDWindow, m.withdraws) {
		out = append(out, checks.XIDEvent{GPU: e.GPU, Code: e.Code, Class: string(e.Class),
			Fatal: m.withdraws(e.Code), Application: e.Class == xid.Application, At: e.At})
	}
	return out
}

// RecordXID adds an XID to the history; when new, it publishes it and asks for an
// immediate checklist run.
func (m *Monitor) RecordXID(e xid.Event, kmsgSeq uint64) {
	if e.Class == "" {
		e.Class = xid.ClassOf(e.Code)
	}
	if e.PCIBusID == "" && e.GPU >= 0 {
		m.mu.Lock()
		e.PCIBusID = m.buses[e.GPU]
		m.mu.Unlock()
	}
	if !m.xids.Add(e, kmsgSeq) {
		return
	}
	m.log.Warn("XID", "gpu", e.GPU, "pci_bus_id", e.PCIBusID, "xid", e.Code, "class", e.Class, "source", e.Source, "message", e.Message)
	ev := e
	m.broker.Publish(Event{Time: e.At, XID: &ev})
	m.Kick()
}

// GPUsReset tells the XID history the GPUs were reset (the simulator clears faults
// this way), so their earlier fatal XIDs no longer count, and re-runs the checks.
func (m *Monitor) GPUsReset(gpus []int) {
	now := m.cfg.Now()
	for _, g := range gpus {
		m.xids.Reset(g, now)
	}
	m.Kick()
}

// Run checks continuously until ctx ends: every Interval, at once on XIDs and kicks.
// It watches NVML events and, when configured, the kernel log.
func (m *Monitor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.watchNVML(ctx) }()
	if m.cfg.KmsgPath != "" {
		wg.Add(1)
		go func() { defer wg.Done(); m.watchKmsg(ctx) }()
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	tick := false // the first run reads everything
	for {
		m.runChecks(PhaseContinuous, tick)
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			tick = true
		case <-m.kick:
			tick = false
		}
	}
}

// watchNVML keeps an NVML event watch running while the library is available.
func (m *Monitor) watchNVML(ctx context.Context) {
	for ctx.Err() == nil {
		lib, err := m.cfg.Backend.Library()
		if err == nil {
			err = xid.WatchNVML(ctx, lib, m.log, m.onNVMLEvent)
		}
		if err != nil {
			m.log.Debug("NVML event watch not running", "error", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
	}
}

func (m *Monitor) onNVMLEvent(e xid.NVMLEvent) {
	switch {
	case e.Type&nvml.EventTypeXidCriticalError != 0:
		m.RecordXID(xid.Event{GPU: e.GPU, PCIBusID: e.PCIBusID, Code: uint32(e.Data), At: m.cfg.Now(), Source: "nvml",
			Simulated: m.cfg.Backend.Simulated()}, 0)
	default:
		// ECC and recovery-action events: re-read the counters now.
		m.log.Info("NVML event", "gpu", e.GPU, "type", fmt.Sprintf("%#x", e.Type))
		m.Kick()
	}
}

func (m *Monitor) watchKmsg(ctx context.Context) {
	f, err := xid.OpenKmsg(m.cfg.KmsgPath)
	if err != nil {
		m.log.Warn("kernel log XID watch not running", "error", err)
		return
	}
	go func() { <-ctx.Done(); f.Close() }()
	boot := xid.BootTime()
	err = xid.WatchKmsg(f, m.log, func(r xid.Record) {
		m.RecordXID(xid.Event{GPU: m.gpuByBus(r.PCIBusID), PCIBusID: r.PCIBusID, Code: r.Code, At: boot.Add(r.SinceBoot),
			Source: "kmsg", PID: r.PID, Process: r.Process, Message: r.Message}, r.Seq)
	})
	if err != nil && ctx.Err() == nil {
		m.log.Warn("kernel log XID watch stopped", "error", err)
	}
}

// ReadKmsgOnce adds the XIDs still in the kernel log to the history (validate's view of
// "since boot") and returns how many it found.
func (m *Monitor) ReadKmsgOnce(path string) (int, error) {
	m.mu.Lock()
	primed := len(m.buses) > 0
	m.mu.Unlock()
	if !primed {
		snap := gpu.Read(m.cfg.Backend)
		m.noteLost(&snap)
	}
	n := 0
	boot := xid.BootTime()
	err := xid.DrainKmsg(path, m.log, func(r xid.Record) {
		n++
		m.RecordXID(xid.Event{GPU: m.gpuByBus(r.PCIBusID), PCIBusID: r.PCIBusID, Code: r.Code, At: boot.Add(r.SinceBoot),
			Source: "kmsg", PID: r.PID, Process: r.Process, Message: r.Message}, r.Seq)
	})
	return n, err
}

// gpuByBus maps a normalised PCI bus id to a GPU index, -1 when none matches.
func (m *Monitor) gpuByBus(bus string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for idx, b := range m.buses {
		if nb, err := xid.NormalizeBusID(b); err == nil && nb == bus {
			return idx
		}
	}
	return -1
}

// Results returns the latest result of every check, ordered like the checklist.
func (m *Monitor) Results() []checks.Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]checks.Result, 0, len(m.byKey))
	for _, r := range m.byKey {
		out = append(out, r)
	}
	order := map[checkid.ID]int{}
	for i, id := range checkid.All {
		order[id] = i
	}
	slices.SortFunc(out, func(a, b checks.Result) int {
		if d := order[a.ID] - order[b.ID]; d != 0 {
			return d
		}
		return a.GPU - b.GPU
	})
	return out
}

package xid

import (
	"slices"
	"sync"
	"time"
)

// Event is one XID the agent saw, attributed to a GPU.
type Event struct {
	// GPU is the NVML index, or -1 when the PCI id matches no GPU.
	GPU      int
	PCIBusID string
	Code     uint32
	// Class is the code's class in the table; Tracker.Add and the monitor fill it in
	// when it is empty.
	Class Class
	At    time.Time
	// Source is "kmsg", "nvml" (event set), "nvml-lost" (ERROR_GPU_IS_LOST) or "sim".
	Source           string
	PID              uint32
	Process, Message string
	Simulated        bool
}

// dedupWindow: the same XID on the same GPU from two sources (NVML event and kmsg
// line) within this window is one event.
const dedupWindow = 5 * time.Second

// maxEvents bounds memory; older events drop first, fatal ones last.
const maxEvents = 1024

// Tracker remembers the XIDs seen since boot and the GPUs' resets. It is safe for
// concurrent use.
type Tracker struct {
	mu     sync.Mutex
	events []Event
	resets map[int]time.Time
	seqs   map[uint64]bool
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{resets: map[int]time.Time{}, seqs: map[uint64]bool{}} }

// Add records e unless it duplicates one already recorded, and reports whether it
// was new. kmsgSeq, when not 0, dedups kernel log records re-read after a restart.
func (t *Tracker) Add(e Event, kmsgSeq uint64) bool {
	if e.Class == "" {
		e.Class = ClassOf(e.Code)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if kmsgSeq != 0 {
		if t.seqs[kmsgSeq] {
			return false
		}
		t.seqs[kmsgSeq] = true
	}
	for i := len(t.events) - 1; i >= 0; i-- {
		p := t.events[i]
		if e.At.Sub(p.At) > dedupWindow {
			break
		}
		if p.GPU == e.GPU && p.Code == e.Code && p.Source != e.Source {
			return false
		}
	}
	// A lost GPU answers ERROR_GPU_IS_LOST to every read; one XID 79 per loss.
	if e.Source == "nvml-lost" {
		for _, p := range t.events {
			if p.GPU == e.GPU && p.Code == 79 && p.At.After(t.resets[e.GPU]) {
				return false
			}
		}
	}
	t.events = append(t.events, e)
	if len(t.events) > maxEvents {
		drop := slices.IndexFunc(t.events, func(x Event) bool { return !x.Class.Counts() })
		if drop < 0 {
			drop = 0
		}
		t.events = slices.Delete(t.events, drop, drop+1)
	}
	return true
}

// Reset records that GPU gpu was reset (or, in the simulator, repaired) at: fatal XIDs
// before it no longer count.
func (t *Tracker) Reset(gpu int, at time.Time) {
	t.mu.Lock()
	t.resets[gpu] = at
	t.mu.Unlock()
}

// Events returns what the checks consider, oldest first: XIDs of a class that counts
// toward gpu.xid.fatal since their GPU's last reset, and other XIDs within window of
// now. It is EventsFor with the default classification.
func (t *Tracker) Events(now time.Time, window time.Duration) []Event {
	return t.EventsFor(now, window, nil)
}

// EventsFor is Events where sticky says which codes count until their GPU's reset (the
// profile's gpu.xid.withdraw); nil: the codes whose class counts.
func (t *Tracker) EventsFor(now time.Time, window time.Duration, sticky func(code uint32) bool) []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Event
	for _, e := range t.events {
		counts := e.Class.Counts()
		if sticky != nil {
			counts = sticky(e.Code)
		}
		if counts {
			if e.At.After(t.resets[e.GPU]) {
				out = append(out, e)
			}
		} else if now.Sub(e.At) <= window {
			out = append(out, e)
		}
	}
	return out
}

// Recent returns every XID within window of now, oldest first (what ListGPUs shows).
func (t *Tracker) Recent(now time.Time, window time.Duration) []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Event
	for _, e := range t.events {
		if now.Sub(e.At) <= window {
			out = append(out, e)
		}
	}
	return out
}

// CodeOnGPU is one XID code on one GPU (GPU -1: not attributed to a GPU).
type CodeOnGPU struct {
	GPU  int
	Code uint32
}

// Counts returns how many XIDs were seen per GPU and code since the agent started (for
// the gpurack_xid_errors_total metric).
func (t *Tracker) Counts() map[CodeOnGPU]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[CodeOnGPU]int{}
	for _, e := range t.events {
		m[CodeOnGPU{e.GPU, e.Code}]++
	}
	return m
}

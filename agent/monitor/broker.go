package monitor

import (
	"sync"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/xid"
)

// Event is one thing that happened; exactly one payload is set.
type Event struct {
	Time   time.Time
	Health *HealthChange
	XID    *xid.Event
	Check  *CheckChange
	// Other carries events from other parts (gossip member changes, enrollment), which
	// the API layer knows how to render.
	Other any
}

// HealthChange is a change of the published health summary.
type HealthChange struct {
	Previous *health.Summary
	Current  health.Summary
}

// CheckChange is a check result whose status changed.
type CheckChange struct {
	Previous *checks.Result
	Current  checks.Result
}

// SubscriberBuffer is how many events a subscriber may fall behind before it is
// dropped (the WatchEvents contract says at least 256).
const SubscriberBuffer = 512

// Subscription receives events until it is closed or overflows.
type Subscription struct {
	C <-chan Event
	// Overflowed is closed when the subscriber fell more than SubscriberBuffer events
	// behind; C is closed then too.
	Overflowed <-chan struct{}
	b          *Broker
	c          chan Event
	over       chan struct{}
}

// Broker fans events out to subscribers without ever blocking the publisher.
type Broker struct {
	mu   sync.Mutex
	subs map[*Subscription]bool
}

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{subs: map[*Subscription]bool{}} }

// Subscribe starts a subscription; Close it when done.
func (b *Broker) Subscribe() *Subscription {
	c := make(chan Event, SubscriberBuffer)
	over := make(chan struct{})
	s := &Subscription{C: c, Overflowed: over, b: b, c: c, over: over}
	b.mu.Lock()
	b.subs[s] = true
	b.mu.Unlock()
	return s
}

// Close ends the subscription.
func (s *Subscription) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.subs[s] {
		delete(s.b.subs, s)
		close(s.c)
	}
}

// Publish delivers e to every subscriber; one that is full is dropped and told so.
func (b *Broker) Publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.c <- e:
		default:
			delete(b.subs, s)
			close(s.over)
			close(s.c)
		}
	}
}

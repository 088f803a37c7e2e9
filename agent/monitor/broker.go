package monitor

import (
	"context"
	"sync"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gossip"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/xid"
)

// Event is one thing that happened; exactly one payload is set.
type Event struct {
	Time   time.Time
	Health *HealthChange
	XID    *xid.Event
	Check  *CheckChange
	// Member is a rack member change that gossip saw.
	Member *MemberChange
}

// MemberChange is a change of a rack member (agent/gossip's OnChange).
type MemberChange struct {
	Change gossip.Change
	Member gossip.Member
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

// Follow calls onEvent for every event published on b until ctx ends, from one
// goroutine (the caller's), and closes its subscription when it returns. resync, when
// not nil, is called after each subscription: once at the start, and again each time
// the subscriber fell more than SubscriberBuffer events behind and the broker dropped
// it, when Follow subscribes afresh. A follower that mirrors state (the GPUHealthy
// condition) reads it there, so no change is lost in a gap.
func Follow(ctx context.Context, b *Broker, onEvent func(Event), resync func()) {
	sub := b.Subscribe()
	defer func() { sub.Close() }() // the latest subscription, not the first
	if resync != nil {
		resync()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-sub.C:
			if ok {
				onEvent(e)
				continue
			}
			// Dropped for falling behind (Close is a no-op on it then): subscribe again.
			sub.Close()
			sub = b.Subscribe()
			if resync != nil {
				resync()
			}
		}
	}
}

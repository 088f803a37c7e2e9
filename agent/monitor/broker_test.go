package monitor

import (
	"context"
	"testing"
	"time"
)

func (b *Broker) subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// TestFollowResubscribes: a follower that falls behind is dropped by the broker;
// Follow subscribes again, calls resync (so a mirror reads the current state), keeps
// delivering, and leaves no subscription behind when ctx ends.
func TestFollowResubscribes(t *testing.T) {
	b := NewBroker()
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	got := make(chan Event, 4*SubscriberBuffer)
	resyncs := make(chan struct{}, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := true
		Follow(ctx, b, func(e Event) {
			if first {
				first = false
				<-release // fall behind while the publisher goes on
			}
			got <- e
		}, func() { resyncs <- struct{}{} })
	}()
	<-resyncs // subscribed
	if n := b.subscribers(); n != 1 {
		t.Fatalf("%d subscriptions after Follow started, want 1", n)
	}
	for i := 0; i < SubscriberBuffer+2; i++ {
		b.Publish(Event{Time: time.Unix(int64(i), 0)})
	}
	close(release)
	select {
	case <-resyncs:
	case <-time.After(10 * time.Second):
		t.Fatal("no resync after the subscriber overflowed")
	}
	waitSubscribers(t, b, 1)
	b.Publish(Event{Time: time.Unix(1e6, 0)})
	for {
		e := <-got
		if e.Time.Unix() == 1e6 {
			break // delivered on the new subscription
		}
	}
	cancel()
	<-done
	if n := b.subscribers(); n != 0 {
		t.Errorf("%d subscriptions left after Follow returned", n)
	}
}

func waitSubscribers(t *testing.T, b *Broker, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.subscribers() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscriptions, want %d", b.subscribers(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

package logship

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The queue never holds more than its bounds, whatever is pushed: four writers push far
// more than it holds (lines of random sizes up to 64 KiB) while a slow sender takes
// batches; every push is either queued and later taken, or refused (dropped).
func TestQueueBoundUnderFlood(t *testing.T) {
	const maxLines, maxBytes = 1000, 2 << 20
	q := newQueue(maxLines, maxBytes)
	var pushed, refused atomic.Int64
	var writers sync.WaitGroup
	msgs := []string{"", strings.Repeat("a", 100), strings.Repeat("b", 4<<10), strings.Repeat("c", 64<<10)}
	for w := 0; w < 4; w++ {
		writers.Add(1)
		go func(w int) {
			defer writers.Done()
			for i := 0; i < 50000; i++ {
				if q.push(Entry{Msg: msgs[(i*7+w)%len(msgs)], Source: "container"}) {
					pushed.Add(1)
				} else {
					refused.Add(1)
				}
			}
		}(w)
	}
	done := make(chan struct{})
	go func() { writers.Wait(); close(done) }()
	taken := 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		lines, bytes := q.length()
		if lines > maxLines || bytes > maxBytes {
			t.Fatalf("queue holds %d lines, %d bytes; bounds %d, %d", lines, bytes, maxLines, maxBytes)
		}
		b := q.peek(256 << 10)
		q.commit(len(b))
		taken += len(b)
	}
	for b := q.peek(1 << 20); len(b) > 0; b = q.peek(1 << 20) {
		q.commit(len(b))
		taken += len(b)
	}
	pl, pb := q.peak()
	if pl > maxLines || pb > maxBytes {
		t.Errorf("queue peaked at %d lines, %d bytes; bounds %d, %d", pl, pb, maxLines, maxBytes)
	}
	if int64(taken) != pushed.Load() || pushed.Load()+refused.Load() != 4*50000 || refused.Load() == 0 {
		t.Errorf("taken %d, queued %d, refused %d of %d", taken, pushed.Load(), refused.Load(), 4*50000)
	}
	if l, b := q.length(); l != 0 || b != 0 {
		t.Errorf("empty queue says %d lines, %d bytes", l, b)
	}
	t.Logf("pushed %d, refused %d; peak %d lines, %d bytes", pushed.Load(), refused.Load(), pl, pb)
}

// A batch being retried stays in the queue and counts against the bound: while the
// store is down, nothing more than the bound is held, and the rest is dropped.
func TestQueueKeepsBatchUntilCommitted(t *testing.T) {
	q := newQueue(3, 1<<20)
	for i := 0; i < 5; i++ {
		q.push(Entry{Msg: "x"})
	}
	b := q.peek(1 << 20)
	if len(b) != 3 {
		t.Fatalf("peek %d entries, want 3 (the bound)", len(b))
	}
	if q.push(Entry{Msg: "y"}) {
		t.Error("push accepted while the peeked batch still fills the queue")
	}
	q.commit(2)
	if l, _ := q.length(); l != 1 || !q.push(Entry{Msg: "z"}) {
		t.Errorf("after committing 2: %d lines left, push refused", l)
	}
}

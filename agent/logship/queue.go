package logship

import (
	"sync"
	"time"
)

// Entry is one log line on its way to the store.
type Entry struct {
	Time time.Time
	Msg  string
	// Source is "journal" or "container".
	Source string
	// Journal: the unit (_SYSTEMD_UNIT, else SYSLOG_IDENTIFIER, else kernel for
	// _TRANSPORT=kernel), the priority (0-7) and the entry's boot (_BOOT_ID; empty: the
	// shipper's own, Config.BootID).
	Unit, Priority, BootID string
	// Identifier is the journal's SYSLOG_IDENTIFIER (journalctl -t).
	Identifier string
	// Containers: who wrote it (from the file's path) and the stream (stdout|stderr).
	Namespace, Pod, Container, Stream string
	// Truncated: the shipper cut the line (MaxLine), or journalctl left its message out.
	Truncated bool

	// Where the line came from, so that a sent batch moves the saved position: the
	// journal cursor after it, or the container log file and the offset after it.
	cursor string
	file   fileKey
	offset int64
}

// entryOverhead is what an entry costs beside its message, counted against the queue's
// byte bound: its fields and their JSON names, roughly.
const entryOverhead = 256

func (e *Entry) size() int {
	return len(e.Msg) + len(e.Unit) + len(e.Identifier) + len(e.Namespace) + len(e.Pod) + len(e.Container) + entryOverhead
}

// queue is the bounded queue between the readers and the sender. Push never blocks:
// over either bound the entry is dropped (the caller counts it). The sender looks at
// a batch from the head (peek) and removes it only once the store took it (commit), so
// a batch being retried still counts against the bounds: the queue, in-flight batch
// included, never holds more than maxLines entries or maxBytes bytes.
type queue struct {
	mu                 sync.Mutex
	entries            []Entry
	bytes              int
	maxLines, maxBytes int
	// ready is signalled (without blocking) when an entry arrives.
	ready chan struct{}
	// peak is the most lines and bytes the queue held, for tests.
	peakLines, peakBytes int
}

func newQueue(maxLines, maxBytes int) *queue {
	return &queue{maxLines: maxLines, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

// push adds e; false when it would pass a bound (e is dropped).
func (q *queue) push(e Entry) bool {
	n := e.size()
	q.mu.Lock()
	if len(q.entries)+1 > q.maxLines || q.bytes+n > q.maxBytes {
		q.mu.Unlock()
		return false
	}
	q.entries = append(q.entries, e)
	q.bytes += n
	q.peakLines = max(q.peakLines, len(q.entries))
	q.peakBytes = max(q.peakBytes, q.bytes)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// peek returns up to the first entries whose sizes sum to at most maxBytes (at least
// one entry, if any), without removing them. The slice is the caller's.
func (q *queue) peek(maxBytes int) []Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, sum := 0, 0
	for n < len(q.entries) {
		s := q.entries[n].size()
		if n > 0 && sum+s > maxBytes {
			break
		}
		sum += s
		n++
	}
	return append([]Entry(nil), q.entries[:n]...)
}

// commit removes the first n entries (a batch the store took).
func (q *queue) commit(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := 0; i < n && i < len(q.entries); i++ {
		q.bytes -= q.entries[i].size()
		q.entries[i] = Entry{}
	}
	q.entries = q.entries[min(n, len(q.entries)):]
	if len(q.entries) == 0 {
		q.entries = nil // let the backing array go
	}
}

// length is the queue's lines and bytes now.
func (q *queue) length() (lines, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.entries), q.bytes
}

// peak is the most lines and bytes the queue held so far.
func (q *queue) peak() (lines, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peakLines, q.peakBytes
}

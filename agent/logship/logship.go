// Package logship ships a node's journal and its pods' container logs to the log store
// on the control-plane side (issue 29): gpurack nodes are diskless, their journal is in
// memory (journald Storage=volatile), so a node's logs are lost with its boot unless
// shipped while it runs.
//
// Two readers feed one bounded queue: the journal (journalctl --output=json --follow
// from the start of the boot, or after the saved cursor; decision 0695) and the
// container log files under /var/log/pods (CRI format, partial lines joined, rotations
// followed). One sender POSTs batches of JSON lines to the store's /insert/jsonline
// (docs/monitoring.md, Logs). Everything is bounded and counted (Metrics): a line over
// MaxLine is cut (truncated=true) and never read whole into memory, a full queue drops
// new lines (queue_full) rather than block or grow, and a store that is down is retried
// with backoff while the queue, the batch in flight included, stays within its bounds.
// The journal cursor and file offsets the store took are kept in StateFile (under
// /run/gpurack: an agent restart resumes, a reboot starts afresh).
//
// It is not the log store, nor its gateway (controlplane-bootstrap runs those), nor
// where the endpoint and credentials come from (agent/node wires those from the
// JoinBundle and kubelet's certificate).
package logship

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
)

// Defaults of the bounds (Config's zero values).
const (
	DefaultMaxLine      = 64 << 10
	DefaultQueueLines   = 10000
	DefaultQueueBytes   = 8 << 20
	DefaultBatchBytes   = 1 << 20
	DefaultFlushEvery   = time.Second
	DefaultPollEvery    = time.Second
	DefaultFlushTimeout = 5 * time.Second
)

// Config is what the shipper runs with.
type Config struct {
	// URL is the store's base URL, "https://HOST:PORT" (the JoinBundle's
	// logs_endpoint); TLS the client configuration for https (kubelet's certificate,
	// the cluster CA: ClientTLS).
	URL string
	TLS *tls.Config
	// Node and BootID go into every line (node, boot_id); the gateway overwrites node
	// from the certificate.
	Node, BootID string
	// PodsDir is kubelet's pod log directory (/var/log/pods); empty: no container logs.
	PodsDir string
	// Journalctl is the journalctl program; empty: no journal. JournalArgs are added
	// to its arguments (tests: --file=PATH).
	Journalctl  string
	JournalArgs []string
	// StateFile keeps the positions the store took (/run/gpurack/logship.json);
	// empty: none kept.
	StateFile string
	// MaxLine bounds one line's message in bytes (longer ones are cut: truncated);
	// QueueLines and QueueBytes bound the queue; BatchBytes one POST (before gzip);
	// FlushEvery is the longest a line waits for a batch to fill; PollEvery how often
	// the container log files are read; FlushTimeout how long the final flush may take
	// when the agent stops. Zero: the defaults above.
	MaxLine, QueueLines, QueueBytes, BatchBytes int
	FlushEvery, PollEvery, FlushTimeout         time.Duration
	// Backoff between attempts at a batch the store did not take; zero: 1 s doubling
	// to 30 s.
	Backoff retry.Backoff
	Metrics *Metrics
	Log     *slog.Logger
}

func (c *Config) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxLine, DefaultMaxLine)
	def(&c.QueueLines, DefaultQueueLines)
	def(&c.QueueBytes, DefaultQueueBytes)
	def(&c.BatchBytes, DefaultBatchBytes)
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&c.FlushEvery, DefaultFlushEvery)
	defd(&c.PollEvery, DefaultPollEvery)
	defd(&c.FlushTimeout, DefaultFlushTimeout)
	if c.Backoff.First == 0 {
		c.Backoff = retry.Backoff{First: time.Second, Max: 30 * time.Second}
	}
	if c.Metrics == nil {
		c.Metrics = &Metrics{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Run ships until ctx ends, then reads the container logs once more, flushes the queue
// (FlushTimeout at most), saves the positions and returns nil. It returns an error
// only when it cannot start (no URL).
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if cfg.URL == "" {
		return errors.New("log shipping: no log store URL")
	}
	st, err := loadState(cfg.StateFile, cfg.BootID)
	if err != nil {
		cfg.Log.Warn("log shipping state", "error", err)
	}
	q := newQueue(cfg.QueueLines, cfg.QueueBytes)
	cfg.Metrics.q.Store(q)
	sh := &shipper{cfg: cfg, q: q, st: st, send: newSender(strings.TrimSuffix(cfg.URL, "/"), cfg.TLS, cfg.Node, cfg.BootID)}
	readCtx, stopReading := context.WithCancel(context.Background())
	var readers sync.WaitGroup
	var tl *tailer
	if cfg.PodsDir != "" {
		tl = newTailer(cfg.PodsDir, cfg.MaxLine, st.Files, sh.push, cfg.Log)
	}
	if cfg.Journalctl != "" {
		jr := &journalReader{command: cfg.Journalctl, extra: cfg.JournalArgs, maxLine: cfg.MaxLine, emit: sh.push, metrics: cfg.Metrics, cursor: st.JournalCursor}
		readers.Add(1)
		go func() { defer readers.Done(); sh.runJournal(readCtx, jr) }()
	}
	cfg.Log.Info("shipping logs", "store", cfg.URL, "journal", cfg.Journalctl != "", "pods", cfg.PodsDir,
		"resumed_cursor", st.JournalCursor != "", "max_line", cfg.MaxLine, "queue_lines", cfg.QueueLines, "queue_bytes", cfg.QueueBytes)
	sh.loop(ctx, tl)
	stopReading()
	readers.Wait()
	if tl != nil {
		tl.poll() // what was written up to the stop
		tl.close()
	}
	sh.flush()
	return nil
}

// shipper is one running Run.
type shipper struct {
	cfg  Config
	q    *queue
	st   state
	send *sender
	// saved is when the state was last written.
	saved time.Time
}

// push queues e, counting a cut line and a drop; it never blocks.
func (s *shipper) push(e Entry) {
	if !s.q.push(e) {
		s.cfg.Metrics.addDropped(DropQueueFull, 1)
		return
	}
	if e.Truncated {
		s.cfg.Metrics.addTruncated(e.Source)
	}
}

// runJournal runs journalctl, again after 1 s doubling to 30 s when it exits, until
// ctx ends.
func (s *shipper) runJournal(ctx context.Context, jr *journalReader) {
	retry.Backoff{First: time.Second, Max: 30 * time.Second}.Do(ctx, func(ctx context.Context) error {
		err := jr.run(ctx)
		if err == nil && ctx.Err() == nil {
			err = errors.New("journalctl ended")
		}
		return err
	}, func(f retry.Failure) {
		s.cfg.Log.Warn("reading the journal", "error", f.Err, "retry", f.Wait)
	})
}

// loop polls the container logs and sends batches until ctx ends: a full batch at once,
// what is queued at least every FlushEvery, after a failure not before the backoff.
func (s *shipper) loop(ctx context.Context, tl *tailer) {
	poll := time.NewTicker(s.cfg.PollEvery)
	defer poll.Stop()
	flush := time.NewTicker(s.cfg.FlushEvery)
	defer flush.Stop()
	if tl != nil {
		tl.poll()
	}
	var retryAt time.Time
	failures := 0
	for {
		full := false
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			if tl != nil {
				tl.poll()
			}
			continue
		case <-flush.C:
		case <-s.q.ready:
			_, b := s.q.length()
			full = b >= s.cfg.BatchBytes
			if !full {
				continue
			}
		}
		if time.Now().Before(retryAt) {
			continue
		}
		if err := s.sendAll(ctx, full); err != nil {
			failures++
			wait := s.cfg.Backoff.Delay(failures)
			retryAt = time.Now().Add(wait)
			s.cfg.Log.Warn("shipping logs failed", "error", err, "retry", wait)
		} else {
			failures, retryAt = 0, time.Time{}
		}
	}
}

// sendAll sends batches while there are (onlyFull: while a full one is queued).
func (s *shipper) sendAll(ctx context.Context, onlyFull bool) error {
	for {
		_, b := s.q.length()
		if b == 0 || onlyFull && b < s.cfg.BatchBytes {
			return nil
		}
		batch := s.q.peek(s.cfg.BatchBytes)
		err := s.send.send(ctx, batch)
		if err != nil && !errors.Is(err, errRejected) {
			s.cfg.Metrics.addSendError()
			return err
		}
		s.q.commit(len(batch))
		if err != nil {
			s.cfg.Metrics.addSendError()
			s.cfg.Metrics.addDropped(DropRejected, len(batch))
			s.cfg.Log.Error("log store rejected a batch; dropped", "lines", len(batch), "error", err)
		} else {
			s.count(batch)
		}
		s.st.advance(batch)
		if time.Since(s.saved) >= time.Second {
			s.saveState()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (s *shipper) count(batch []Entry) {
	for i := range batch {
		s.cfg.Metrics.addShipped(batch[i].Source, 1, len(batch[i].Msg))
	}
}

func (s *shipper) saveState() {
	s.saved = time.Now()
	if err := s.st.save(s.cfg.StateFile); err != nil {
		s.cfg.Log.Warn("saving the log shipping state", "error", err)
	}
}

// flush sends what is queued within FlushTimeout; what is left is dropped (shutdown).
func (s *shipper) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.FlushTimeout)
	defer cancel()
	err := s.sendAll(ctx, false)
	if n, _ := s.q.length(); n > 0 {
		s.cfg.Metrics.addDropped(DropShutdown, n)
		s.cfg.Log.Warn("log lines not shipped at stop", "lines", n, "error", err)
		s.q.commit(n)
	}
	s.saveState()
}

// BootID reads this boot's id (/proc/sys/kernel/random/boot_id) in the journal's form:
// 32 lowercase hex digits, no dashes (docs/contracts.md §15, boot_id).
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return JournalBootID(string(b))
}

// JournalBootID is a boot id in the journal's form (no dashes, lower case).
func JournalBootID(id string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimSpace(id), "-", ""))
}

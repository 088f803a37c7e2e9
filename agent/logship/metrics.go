package logship

import (
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Why a line was dropped (the reason label of gpurack_logs_dropped_lines_total).
const (
	// DropQueueFull: the queue was at its line or byte bound (the store slow or down,
	// or a flood faster than it takes).
	DropQueueFull = "queue_full"
	// DropJournalUnreadable: a journalctl output line the shipper could not parse, or
	// one longer than its bound.
	DropJournalUnreadable = "journal_unreadable"
	// DropShutdown: still queued when the agent stopped and the final flush ran out of
	// time or the store refused it.
	DropShutdown = "shutdown"
	// DropRejected: the store answered a batch with a client error (4xx other than 429)
	// that sending again cannot fix; the batch is dropped so the rest can go.
	DropRejected = "rejected"
)

// Metrics counts what the shipper did. It is a prometheus.Collector: the agent
// registers it beside its own collector, so the series appear on gpuagent's /metrics.
type Metrics struct {
	// Hostname labels every series, as the agent's other node series are labelled,
	// read at every scrape (the join renames the machine); nil: os.Hostname. The zero
	// Metrics is ready to use.
	Hostname func() string

	shipped, shippedBytes, sendErrors sync.Map // source -> *atomic.Int64 (sendErrors: one key)
	dropped                           sync.Map // reason -> *atomic.Int64
	truncated                         sync.Map // source -> *atomic.Int64
	q                                 atomic.Pointer[queue]
}

func counterOf(m *sync.Map, key string) *atomic.Int64 {
	v, _ := m.LoadOrStore(key, new(atomic.Int64))
	return v.(*atomic.Int64)
}

func (m *Metrics) addShipped(source string, lines, bytes int) {
	counterOf(&m.shipped, source).Add(int64(lines))
	counterOf(&m.shippedBytes, source).Add(int64(bytes))
}
func (m *Metrics) addDropped(reason string, n int)  { counterOf(&m.dropped, reason).Add(int64(n)) }
func (m *Metrics) addTruncated(source string)       { counterOf(&m.truncated, source).Add(1) }
func (m *Metrics) addSendError()                    { counterOf(&m.sendErrors, "").Add(1) }
func (m *Metrics) Dropped(reason string) int64      { return counterOf(&m.dropped, reason).Load() }
func (m *Metrics) Shipped(source string) int64      { return counterOf(&m.shipped, source).Load() }
func (m *Metrics) Truncated(source string) int64    { return counterOf(&m.truncated, source).Load() }
func (m *Metrics) SendErrors() int64                { return counterOf(&m.sendErrors, "").Load() }
func (m *Metrics) ShippedBytes(source string) int64 { return counterOf(&m.shippedBytes, source).Load() }

var (
	mShipped = prometheus.NewDesc("gpurack_logs_shipped_lines_total",
		"Log lines the log store accepted, by source (journal, container).", []string{"Hostname", "source"}, nil)
	mShippedBytes = prometheus.NewDesc("gpurack_logs_shipped_bytes_total",
		"Bytes of log messages the log store accepted, by source.", []string{"Hostname", "source"}, nil)
	mDropped = prometheus.NewDesc("gpurack_logs_dropped_lines_total",
		"Log lines never shipped, by reason: queue_full, journal_unreadable, rejected, shutdown.", []string{"Hostname", "reason"}, nil)
	mTruncated = prometheus.NewDesc("gpurack_logs_truncated_lines_total",
		"Log lines shipped cut to the line bound (truncated=true in the store), by source.", []string{"Hostname", "source"}, nil)
	mSendErrors = prometheus.NewDesc("gpurack_logs_send_errors_total",
		"Batches the log store did not take (unreachable, refused, an error answer); each is sent again after a backoff.", []string{"Hostname"}, nil)
	mQueueLines = prometheus.NewDesc("gpurack_logs_queue_lines",
		"Log lines waiting to be shipped (the batch being sent included).", []string{"Hostname"}, nil)
	mQueueBytes = prometheus.NewDesc("gpurack_logs_queue_bytes",
		"Bytes the waiting log lines count against the queue's byte bound.", []string{"Hostname"}, nil)
)

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mShipped, mShippedBytes, mDropped, mTruncated, mSendErrors, mQueueLines, mQueueBytes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The sources and the queue_full reason are
// always there (at 0), so an alert's rate() has a series from the start.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	host, _ := os.Hostname()
	if m.Hostname != nil {
		host = m.Hostname()
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{host}, labels...)...)
	}
	for _, src := range []string{"journal", "container"} {
		counterOf(&m.shipped, src)
		counterOf(&m.shippedBytes, src)
		counterOf(&m.truncated, src)
	}
	counterOf(&m.dropped, DropQueueFull)
	each := func(sm *sync.Map, d *prometheus.Desc) {
		sm.Range(func(k, v any) bool { counter(d, v.(*atomic.Int64).Load(), k.(string)); return true })
	}
	each(&m.shipped, mShipped)
	each(&m.shippedBytes, mShippedBytes)
	each(&m.dropped, mDropped)
	each(&m.truncated, mTruncated)
	counter(mSendErrors, m.SendErrors())
	lines, bytes := 0, 0
	if q := m.q.Load(); q != nil {
		lines, bytes = q.length()
	}
	ch <- prometheus.MustNewConstMetric(mQueueLines, prometheus.GaugeValue, float64(lines), host)
	ch <- prometheus.MustNewConstMetric(mQueueBytes, prometheus.GaugeValue, float64(bytes), host)
}

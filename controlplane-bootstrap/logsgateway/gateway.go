package logsgateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults of Config (and of cluster.yaml's monitoring.logs.gateway).
const (
	DefaultMaxRequestBytes = 16 << 20
	// DecodedFactor bounds a gzip body after decompression: MaxRequestBytes times this.
	DecodedFactor        = 4
	DefaultMaxConcurrent = 8
	DefaultMaxPerNode    = 2
	DefaultQueueWait     = 5 * time.Second
)

// Config is what a Gateway forwards to and how much it takes.
type Config struct {
	// Upstream is VictoriaLogs' base URL on loopback, http://127.0.0.1:9429.
	Upstream string
	// MaxRequestBytes bounds a body as sent (413 beyond, nothing stored); a gzip body
	// is also bounded to DecodedFactor times it after decompression.
	MaxRequestBytes int64
	// MaxConcurrent bounds the requests read or forwarded at once, MaxPerNode those of
	// one node; one more waits QueueWait for a slot, then is 429.
	MaxConcurrent, MaxPerNode int
	QueueWait                 time.Duration
	// MetricsUser is the client certificate CN that may read /metrics
	// (gpurack:monitoring); empty: nobody.
	MetricsUser string
	// Logf reports refused and failed requests; nil discards.
	Logf func(format string, args ...any)
}

// Gateway is the http.Handler of the gateway's TLS listener.
type Gateway struct {
	cfg     Config
	client  *http.Client
	slots   chan struct{}
	mu      sync.Mutex
	perNode map[string]int

	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	bytesIn  prometheus.Counter
	inFlight prometheus.Gauge
}

// New returns a Gateway for cfg, zero fields defaulted.
func New(cfg Config) *Gateway {
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.MaxPerNode <= 0 {
		cfg.MaxPerNode = DefaultMaxPerNode
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = DefaultQueueWait
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	g := &Gateway{
		cfg: cfg,
		// VictoriaLogs queues an insert up to a minute (-insert.maxQueueDuration).
		client:  &http.Client{Timeout: 90 * time.Second},
		slots:   make(chan struct{}, cfg.MaxConcurrent),
		perNode: map[string]int{},
		reg:     prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpurack_logs_gateway_requests_total",
			Help: "Insert requests by HTTP status answered and reason (stored, store_error, not_node, bad_query, bad_encoding, too_large, busy, bad_body, method).",
		}, []string{"code", "reason"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpurack_logs_gateway_received_bytes_total",
			Help: "Bytes of insert bodies forwarded to the store, as sent.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpurack_logs_gateway_requests_in_flight",
			Help: "Insert requests being read or forwarded.",
		}),
	}
	g.reg.MustRegister(g.requests, g.bytesIn, g.inFlight)
	return g
}

// ServeHTTP serves /healthz to anyone, /metrics to cfg.MetricsUser and /insert/jsonline
// to nodes; any other path is 404.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		io.WriteString(w, "ok\n")
	case "/metrics":
		cert := peerCert(r)
		if g.cfg.MetricsUser == "" || cert == nil || cert.Subject.CommonName != g.cfg.MetricsUser {
			http.Error(w, "forbidden: /metrics takes the monitoring client certificate (CN "+g.cfg.MetricsUser+")", http.StatusForbidden)
			return
		}
		promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	case InsertPath:
		code, reason, msg := g.insert(r)
		g.requests.WithLabelValues(strconv.Itoa(code), reason).Inc()
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		if code >= 300 {
			g.cfg.Logf("%s %s from %s: %d %s", r.Method, r.URL.Path, r.RemoteAddr, code, msg)
			http.Error(w, msg, code)
			return
		}
		w.WriteHeader(code)
	default:
		http.Error(w, "not found: the log gateway takes only POST "+InsertPath, http.StatusNotFound)
	}
}

func peerCert(r *http.Request) *x509.Certificate {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	return r.TLS.PeerCertificates[0]
}

// insert checks and forwards one request; it returns the status to answer, the reason
// label and, for a refusal, what to tell the node.
func (g *Gateway) insert(r *http.Request) (int, string, string) {
	node, err := NodeName(peerCert(r))
	if err != nil {
		return http.StatusForbidden, "not_node", err.Error()
	}
	if r.Method != http.MethodPost {
		return http.StatusMethodNotAllowed, "method", "method " + r.Method + ": use POST"
	}
	if err := CheckQuery(r.URL.RawQuery); err != nil {
		return http.StatusBadRequest, "bad_query", err.Error()
	}
	gz, err := CheckEncoding(r.Header.Get("Content-Encoding"))
	if err != nil {
		return http.StatusUnsupportedMediaType, "bad_encoding", err.Error()
	}
	if r.ContentLength > g.cfg.MaxRequestBytes {
		return http.StatusRequestEntityTooLarge, "too_large", g.tooLarge(r.ContentLength)
	}
	release, ok := g.acquire(r.Context(), node)
	if !ok {
		return http.StatusTooManyRequests, "busy", fmt.Sprintf("busy: %d requests at once, %d from one node; retry after a second", g.cfg.MaxConcurrent, g.cfg.MaxPerNode)
	}
	defer release()
	body, err := readBounded(r.Body, g.cfg.MaxRequestBytes)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return http.StatusRequestEntityTooLarge, "too_large", g.tooLarge(-1)
		}
		return http.StatusBadRequest, "bad_body", "read the body: " + err.Error()
	}
	if gz {
		if err := checkGzip(body, DecodedFactor*g.cfg.MaxRequestBytes); err != nil {
			if errors.Is(err, errTooLarge) {
				return http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes after gzip: send smaller batches", DecodedFactor*g.cfg.MaxRequestBytes)
			}
			return http.StatusBadRequest, "bad_body", "gzip body: " + err.Error()
		}
	}
	return g.forward(r.Context(), node, body, gz)
}

func (g *Gateway) tooLarge(n int64) string {
	if n < 0 {
		return fmt.Sprintf("the body is over %d bytes: send smaller batches", g.cfg.MaxRequestBytes)
	}
	return fmt.Sprintf("the body is %d bytes, over %d: send smaller batches", n, g.cfg.MaxRequestBytes)
}

// acquire takes a slot for node: at most MaxPerNode of its requests at once (one more
// is refused at once), and at most MaxConcurrent in all (one more waits QueueWait).
func (g *Gateway) acquire(ctx context.Context, node string) (func(), bool) {
	g.mu.Lock()
	if g.perNode[node] >= g.cfg.MaxPerNode {
		g.mu.Unlock()
		return nil, false
	}
	g.perNode[node]++
	g.mu.Unlock()
	undo := func() {
		g.mu.Lock()
		if g.perNode[node]--; g.perNode[node] == 0 {
			delete(g.perNode, node)
		}
		g.mu.Unlock()
	}
	t := time.NewTimer(g.cfg.QueueWait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
	case <-t.C:
		undo()
		return nil, false
	case <-ctx.Done():
		undo()
		return nil, false
	}
	g.inFlight.Inc()
	return func() {
		<-g.slots
		g.inFlight.Dec()
		undo()
	}, true
}

var errTooLarge = errors.New("too large")

// readBounded reads all of r, or errTooLarge past max bytes.
func readBounded(r io.Reader, max int64) ([]byte, error) {
	var b bytes.Buffer
	n, err := b.ReadFrom(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, errTooLarge
	}
	return b.Bytes(), nil
}

// checkGzip decompresses body into nothing: errTooLarge past max bytes, or why it is
// not gzip.
func checkGzip(body []byte, max int64) error {
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, io.LimitReader(zr, max+1))
	if err != nil {
		return err
	}
	if n > max {
		return errTooLarge
	}
	return nil
}

// forward posts body to VictoriaLogs as node's lines and relays its status.
func (g *Gateway) forward(ctx context.Context, node string, body []byte, gz bool) (int, string, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, UpstreamURL(g.cfg.Upstream, node), bytes.NewReader(body))
	if err != nil {
		return http.StatusInternalServerError, "store_error", err.Error()
	}
	req.Header.Set("Content-Type", "application/stream+json")
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return http.StatusBadGateway, "store_error", "the log store is unreachable: " + err.Error()
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode/100 == 2:
		g.bytesIn.Add(float64(len(body)))
		return http.StatusNoContent, "stored", ""
	case resp.StatusCode == http.StatusBadRequest:
		return http.StatusBadRequest, "bad_body", "the log store refused the lines: " + string(bytes.TrimSpace(msg))
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests:
		return http.StatusServiceUnavailable, "store_error", "the log store is busy: " + string(bytes.TrimSpace(msg))
	}
	return http.StatusBadGateway, "store_error", fmt.Sprintf("the log store answered %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
}

// TLSConfig is the listener's TLS: the serving pair, and client certificates verified
// against clientCAs when given (a request without one reaches only /healthz).
func TLSConfig(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    clientCAs,
	}
}

// Serve serves g on ln with tlsCfg until ctx ends, then shuts down within 10 s.
func Serve(ctx context.Context, ln net.Listener, tlsCfg *tls.Config, g http.Handler) error {
	srv := &http.Server{
		Handler:           g,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		// A 16 MiB body over a slow link; VictoriaLogs' queue (a minute) on the way back.
		ReadTimeout:    2 * time.Minute,
		WriteTimeout:   3 * time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       nil,
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

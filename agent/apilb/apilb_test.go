package apilb

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Short periods so that checks happen many times a test; the timeout is generous so a
// loaded machine (the race detector, other jobs) does not fail a check spuriously.
const (
	testInterval = 100 * time.Millisecond
	testTimeout  = time.Second
	// slack bounds waits that only detect failures (a hang, a check that never
	// comes): never a claim about speed.
	slack = 5 * time.Second
)

// fakeAPI is a stand-in apiserver: TLS with httptest's certificate (which covers
// 127.0.0.1 and example.com), /readyz answering 200 or 500 as ready says, and /whoami
// answering its name.
type fakeAPI struct {
	name  string
	srv   *httptest.Server
	ready atomic.Bool
}

func newFakeAPI(t *testing.T, name string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{name: name}
	f.ready.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !f.ready.Load() {
			http.Error(w, "[-]etcd failed: reason withheld", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, f.name)
	})
	f.srv = httptest.NewUnstartedServer(mux)
	// Handshakes the balancer cuts short are expected here; keep them out of the log.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// addr is the fake's host:port.
func (f *fakeAPI) addr() string { return f.srv.Listener.Addr().String() }

// certPool trusts the certificates of fakes.
func certPool(fakes ...*fakeAPI) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, f := range fakes {
		pool.AddCert(f.srv.Certificate())
	}
	return pool
}

// lockedBuffer is a bytes.Buffer safe for the balancer's goroutines and the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// count is how many log lines contain every one of parts. Each line is matched with a
// space for its newline, so "upstream=ADDR " matches ADDR whether or not it ends the line.
func (b *lockedBuffer) count(parts ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for line := range strings.Lines(b.buf.String()) {
		line = strings.TrimSuffix(line, "\n") + " "
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// running is a balancer being served by a test.
type running struct {
	b    *Balancer
	logs *lockedBuffer
	stop func() error // cancels Serve and returns its result; fails the test on a hang
}

// serve makes a balancer over fakes (trusting them all), checking every testInterval,
// and serves it until stop or the test's end.
func serve(t *testing.T, fakes ...*fakeAPI) *running {
	t.Helper()
	return serveEvery(t, testInterval, fakes...)
}

// serveEvery is serve with the health checks every interval.
func serveEvery(t *testing.T, interval time.Duration, fakes ...*fakeAPI) *running {
	t.Helper()
	var ups []string
	for _, f := range fakes {
		ups = append(ups, f.addr())
	}
	logs := &lockedBuffer{}
	b, err := New(Config{
		Listen:    "127.0.0.1:0",
		Upstreams: ups,
		RootCAs:   certPool(fakes...),
		Interval:  interval,
		Timeout:   testTimeout,
		Log:       slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), nil)),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	r := &running{b: b, logs: logs}
	r.stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(slack):
			t.Errorf("Serve still running %v after its context was cancelled", slack)
			return nil
		}
	})
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

// url is the balancer's address for path.
func (r *running) url(path string) string { return "https://" + r.b.Addr().String() + path }

// status is the balancer's view of the upstream at addr.
func (r *running) status(t *testing.T, addr string) UpstreamStatus {
	t.Helper()
	for _, s := range r.b.Status() {
		if s.Address == addr {
			return s
		}
	}
	t.Fatalf("Status has no upstream %s: %+v", addr, r.b.Status())
	return UpstreamStatus{}
}

// httpClient talks TLS through the balancer, trusting pool; keepAlive false gives a
// new connection (and so a new choice of upstream) for every request.
func httpClient(pool *x509.CertPool, keepAlive bool) *http.Client {
	return &http.Client{
		Timeout: 2 * slack,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			DisableKeepAlives: !keepAlive,
		},
	}
}

// whoami asks which upstream serves url, and whether the request went on a reused
// connection (the last connection the client got, after any retry of its own).
func whoami(c *http.Client, url string) (name string, reused bool, err error) {
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		mu.Lock()
		reused = info.Reused
		mu.Unlock()
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
		http.MethodGet, url, nil)
	if err != nil {
		return "", false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	mu.Lock()
	defer mu.Unlock()
	return string(body), reused, err
}

// tally makes n requests for /whoami, each on a new connection, and counts the
// answers; any failed request fails the test.
func tally(t *testing.T, r *running, pool *x509.CertPool, n int) map[string]int {
	t.Helper()
	c := httpClient(pool, false)
	got := map[string]int{}
	for i := range n {
		name, _, err := whoami(c, r.url("/whoami"))
		if err != nil {
			t.Fatalf("request %d through the balancer: %v", i, err)
		}
		got[name]++
	}
	return got
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRoundRobin: new connections go to every upstream in turn.
func TestRoundRobin(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	r := serve(t, a, b)
	got := tally(t, r, certPool(a, b), 10)
	// Strict round-robin gives 5 and 5; allow a spurious failed check or two.
	if got["a"] < 3 || got["b"] < 3 || got["a"]+got["b"] != 10 {
		t.Errorf("10 new connections reached %v; want both a and b, about evenly", got)
	}
}

// TestUnreadyUpstream: an upstream whose /readyz answers 500 gets no new connections
// once checked, shows unhealthy with the status in LastError, is logged once however
// many checks fail, and is used again once /readyz answers 200.
func TestUnreadyUpstream(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	r := serve(t, a, b)
	pool := certPool(a, b)

	a.ready.Store(false)
	waitFor(t, testInterval+testTimeout+slack, "a shown unhealthy", func() bool {
		return !r.status(t, a.addr()).Healthy
	})
	if s := r.status(t, a.addr()); !strings.Contains(s.LastError, "500") {
		t.Errorf("a's LastError = %q; want it to mention the 500", s.LastError)
	}
	if got := tally(t, r, pool, 10); got["b"] != 10 {
		t.Errorf("with a unready, 10 new connections reached %v; want all on b", got)
	}
	time.Sleep(5 * testInterval) // several more failed checks, which must not log again
	if n := r.logs.count("upstream unhealthy", "upstream="+a.addr()+" "); n != 1 {
		t.Errorf("logged a unhealthy %d times; want once:\n%s", n, r.logs)
	}
	if s := r.status(t, b.addr()); !s.Healthy || s.LastError != "" {
		t.Errorf("b = %+v; want healthy with no error", s)
	}

	a.ready.Store(true)
	waitFor(t, testInterval+testTimeout+slack, "a shown healthy again", func() bool {
		s := r.status(t, a.addr())
		return s.Healthy && s.LastError == ""
	})
	if got := tally(t, r, pool, 10); got["a"] == 0 {
		t.Errorf("with a ready again, 10 new connections reached %v; want some on a", got)
	}
}

// TestFailoverClosesConnections: when an upstream turns unhealthy the balancer closes
// the client connections spliced to it, so a keep-alive client's next request goes on
// a new connection, to the other upstream.
func TestFailoverClosesConnections(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	r := serve(t, a, b)
	c := httpClient(certPool(a, b), true)

	first, _, err := whoami(c, r.url("/whoami"))
	if err != nil {
		t.Fatal(err)
	}
	on, other := a, b // the upstream the client's connection landed on, and the other
	if first == "b" {
		on, other = b, a
	}
	name, reused, err := whoami(c, r.url("/whoami"))
	if err != nil || name != on.name || !reused {
		t.Fatalf("second request: %q reused=%v err=%v; want %q on the same connection", name, reused, err, on.name)
	}
	if s := r.status(t, on.addr()); s.Active != 1 {
		t.Fatalf("%s.Active = %d; want 1, the client's connection", on.name, s.Active)
	}

	on.ready.Store(false)
	waitFor(t, testInterval+testTimeout+slack, on.name+" unhealthy with its connection closed", func() bool {
		s := r.status(t, on.addr())
		return !s.Healthy && s.Active == 0
	})
	name, reused, err = whoami(c, r.url("/whoami"))
	if err != nil {
		t.Fatalf("request after failover: %v", err)
	}
	if reused || name != other.name {
		t.Errorf("request after failover: %q reused=%v; want %q on a new connection", name, reused, other.name)
	}
	if s := r.status(t, other.addr()); s.Active != 1 {
		t.Errorf("%s.Active = %d; want 1, the client's new connection", other.name, s.Active)
	}
}

// TestDeadUpstream: an upstream that refuses connections costs clients nothing: the
// failed dial marks it unhealthy at once, without waiting for a health check, and the
// connection goes to the other upstream.
func TestDeadUpstream(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	// One check each, at the start; after that only dials can find a dead.
	r := serveEvery(t, time.Hour, a, b)
	waitFor(t, testTimeout+slack, "the first checks passed", func() bool {
		return r.logs.count("upstream healthy", "upstream="+a.addr()+" ") == 1 &&
			r.logs.count("upstream healthy", "upstream="+b.addr()+" ") == 1
	})
	a.srv.Close()

	if got := tally(t, r, certPool(a, b), 10); got["b"] != 10 {
		t.Errorf("with a dead, 10 new connections reached %v; want all on b", got)
	}
	if s := r.status(t, a.addr()); s.Healthy || !strings.Contains(s.LastError, "dial") {
		t.Errorf("a = %+v; want unhealthy, with the dial's error", s)
	}
	if n := r.logs.count("level=WARN", "dial apiserver upstream failed", "upstream="+a.addr()+" "); n != 1 {
		t.Errorf("logged %d failed dials to a; want 1 (then it is skipped):\n%s", n, r.logs)
	}
}

// TestAllUpstreamsDead: with no upstream reachable a client connection is closed
// promptly, neither left hanging nor spliced anywhere.
func TestAllUpstreamsDead(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	r := serve(t, a, b)
	a.srv.Close()
	b.srv.Close()

	start := time.Now()
	if name, _, err := whoami(httpClient(certPool(a, b), false), r.url("/whoami")); err == nil {
		t.Errorf("request with every upstream dead reached %q; want an error", name)
	}
	if d := time.Since(start); d > slack {
		t.Errorf("the failing request took %v; want the connection closed, not left hanging", d)
	}

	conn, err := net.Dial("tcp", r.b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(slack))
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("raw connection read %d bytes, err %v; want EOF, the balancer closing it", n, err)
	}
	for _, s := range r.b.Status() {
		if s.Healthy || s.Active != 0 || s.LastError == "" {
			t.Errorf("%+v; want unhealthy, no connections, an error", s)
		}
	}
}

// TestNewRejectsBadConfig: each invalid Config fails New with an error naming the
// problem, and a valid one passes.
func TestNewRejectsBadConfig(t *testing.T) {
	f := newFakeAPI(t, "a")
	pool := certPool(f)
	ok := Config{Listen: "127.0.0.1:0", Upstreams: []string{"10.0.0.1:6443", "[fd00::1]:6443"}, RootCAs: pool}
	with := func(edit func(*Config)) Config {
		c := ok
		edit(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // substrings of the error
	}{
		{"no upstreams", with(func(c *Config) { c.Upstreams = nil }), []string{"Upstreams", "empty"}},
		{"no port", with(func(c *Config) { c.Upstreams = []string{"10.0.0.1"} }), []string{"Upstreams[0]", "not host:port"}},
		{"bad port", with(func(c *Config) { c.Upstreams = []string{"10.0.0.1:6443", "10.0.0.2:api"} }), []string{"Upstreams[1]", "port"}},
		{"port 0", with(func(c *Config) { c.Upstreams = []string{"10.0.0.1:0"} }), []string{"Upstreams[0]", "port"}},
		{"no host", with(func(c *Config) { c.Upstreams = []string{":6443"} }), []string{"Upstreams[0]", "host"}},
		{"duplicate", with(func(c *Config) { c.Upstreams = []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.1:6443"} }), []string{"Upstreams[2]", "duplicate", "Upstreams[0]"}},
		{"duplicate spelled otherwise", with(func(c *Config) { c.Upstreams = []string{"[fd00::1]:6443", "[fd00:0::1]:06443"} }), []string{"Upstreams[1]", "duplicate"}},
		{"no RootCAs", with(func(c *Config) { c.RootCAs = nil }), []string{"RootCAs"}},
		{"no Listen", with(func(c *Config) { c.Listen = "" }), []string{"Listen"}},
		{"Listen unusable", with(func(c *Config) { c.Listen = "127.0.0.1:99999" }), []string{"Listen"}},
		{"negative Interval", with(func(c *Config) { c.Interval = -time.Second }), []string{"Interval"}},
		{"negative Timeout", with(func(c *Config) { c.Timeout = -time.Second }), []string{"Timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg)
			if err == nil {
				b.ln.Close()
				t.Fatalf("New(%+v) succeeded; want an error mentioning %q", tc.cfg, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %v; want it to mention %q", err, w)
				}
			}
		})
	}
	b, err := New(ok)
	if err != nil {
		t.Fatalf("New(valid config): %v", err)
	}
	b.ln.Close()
}

// TestServeStops: before Serve, Status lists the upstreams in Config order, assumed
// healthy; Serve returns nil once its context ends, having closed the spliced
// connections and the listener.
func TestServeStops(t *testing.T) {
	a, b := newFakeAPI(t, "a"), newFakeAPI(t, "b")
	bal, err := New(Config{
		Listen:    "127.0.0.1:0",
		Upstreams: []string{b.addr(), a.addr()},
		RootCAs:   certPool(a, b),
		Log:       slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []UpstreamStatus{{Address: b.addr(), Healthy: true}, {Address: a.addr(), Healthy: true}}
	if got := bal.Status(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Status before Serve = %+v; want %+v", got, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- bal.Serve(ctx) }()
	conn, err := net.Dial("tcp", bal.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, slack, "the raw connection spliced", func() bool {
		n := 0
		for _, s := range bal.Status() {
			n += s.Active
		}
		return n == 1
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v; want nil after its context ended", err)
		}
	case <-time.After(slack):
		t.Fatalf("Serve still running %v after its context was cancelled", slack)
	}
	conn.SetReadDeadline(time.Now().Add(slack))
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("spliced connection read %d bytes, err %v after Serve; want EOF", n, err)
	}
	if c, err := net.DialTimeout("tcp", bal.Addr().String(), slack); err == nil {
		c.Close()
		t.Errorf("the listener still accepts after Serve returned")
	}
	if err := bal.Serve(context.Background()); err == nil {
		t.Errorf("a second Serve returned nil; want an error")
	}
}

// TestLoneUnreadyUpstreamKeepsConnections: with one upstream, a failed check marks it
// unhealthy but leaves its connections be (there is nowhere better to send them, and a
// check that was only slow must not cut the node off); the client's next request goes
// on over the same connection.
func TestLoneUnreadyUpstreamKeepsConnections(t *testing.T) {
	a := newFakeAPI(t, "a")
	r := serve(t, a)
	c := httpClient(certPool(a), true)
	if _, _, err := whoami(c, r.url("/whoami")); err != nil {
		t.Fatal(err)
	}
	a.ready.Store(false)
	waitFor(t, testInterval+testTimeout+slack, "a unhealthy", func() bool { return !r.status(t, a.addr()).Healthy })
	time.Sleep(3 * testInterval) // more failed checks: none may close it either
	name, reused, err := whoami(c, r.url("/whoami"))
	if err != nil || name != "a" || !reused {
		t.Errorf("request after a's check failed: %q reused=%v err=%v; want a, over the same connection", name, reused, err)
	}
	if s := r.status(t, a.addr()); s.Active != 1 {
		t.Errorf("a.Active = %d; want 1, the client's connection kept", s.Active)
	}
}

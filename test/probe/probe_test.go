package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/internal/testreq"
)

func get(t *testing.T, h http.Handler, target string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	var body map[string]any
	json.Unmarshal(rec.Body.Bytes(), &body)
	return rec.Code, body
}

func TestHandler(t *testing.T) {
	target := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	var conns atomic.Int32
	target.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	target.Start()
	defer target.Close()
	h := newHandler("node-a", newClient(filepath.Join(t.TempDir(), "no-ca.crt")))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 200 || rec.Body.String() != "probe on node-a\n" {
		t.Errorf("/ = %d %q", rec.Code, rec.Body)
	}
	code, body := get(t, h, "/resolve?name=localhost")
	if addrs, _ := body["addresses"].([]any); code != 200 || !slices.ContainsFunc(addrs, func(a any) bool { return a == "127.0.0.1" || a == "::1" }) {
		t.Errorf("/resolve?name=localhost = %d %v", code, body)
	}
	if code, body := get(t, h, "/resolve?name="); code != http.StatusBadGateway || !strings.Contains(body["error"].(string), "want a DNS name") {
		t.Errorf("/resolve without a name = %d %v", code, body)
	}
	if code, body := get(t, h, "/resolve?name="+strings.Repeat("a", 300)); code != http.StatusBadGateway || body["error"] == nil {
		t.Errorf("/resolve with a long name = %d %v", code, body)
	}
	for range 2 {
		if code, body := get(t, h, "/fetch?url="+target.URL); code != 200 || body["status"] != "418 I'm a teapot" || body["connectMicros"] == nil {
			t.Errorf("/fetch = %d %v", code, body)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("two /fetch made %d connections, want a new one each", n)
	}
	if code, body := get(t, h, "/fetch?url=file:///etc/passwd"); code != http.StatusBadGateway || !strings.Contains(body["error"].(string), "http or https") {
		t.Errorf("/fetch of a file URL = %d %v", code, body)
	}
}

// TestFetchTrustsServiceAccountCA: fetch reaches an https server whose CA is the
// one in the CA file, as a pod reaches the apiserver.
func TestFetchTrustsServiceAccountCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	if _, err := fetch(t.Context(), newClient(filepath.Join(t.TempDir(), "none")), srv.URL); err == nil {
		t.Error("fetch trusted an unknown CA")
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	if status, err := fetch(t.Context(), newClient(ca), srv.URL); err != nil || status != "200 OK" {
		t.Errorf("fetch with the CA: %q %v", status, err)
	}
}

// TestFetchTimedMeasuresConnect: the connect time is the TCP handshake of this
// request, set (non-zero) for a fresh connection and zero on an error.
func TestFetchTimedMeasuresConnect(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	status, connect, err := fetchTimed(t.Context(), &http.Client{Transport: &http.Transport{}}, srv.URL)
	if err != nil || status != "200 OK" || connect <= 0 || connect > time.Minute {
		t.Errorf("fetchTimed = %q, connect %s, %v; want 200 OK and a connect time", status, connect, err)
	}
	if _, connect, err := fetchTimed(t.Context(), &http.Client{}, "ftp://x"); err == nil || connect != 0 {
		t.Errorf("fetchTimed of an ftp URL = connect %s, %v; want an error", connect, err)
	}
}

// TestProbeImageIsReproducible builds the probe image twice the way make probe-image
// does and checks the archives are the same bytes and a complete image.
func TestProbeImageIsReproducible(t *testing.T) {
	testreq.Short(t, "builds the probe twice")
	testreq.Tool(t, "go", "install Go")
	dir := t.TempDir()
	var sums []string
	for _, name := range []string{"a.tar", "b.tar"} {
		out := filepath.Join(dir, name)
		cmd := exec.Command("../../hack/probe-image.sh", out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("hack/probe-image.sh: %v\n%s", err, b)
		}
		f, err := ociarchive.InspectFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.Names, []string{"gpurack.io/probe:v1"}) || f.Images != 1 {
			t.Errorf("probe archive %+v", f.Archive)
		}
		sums = append(sums, f.SHA256)
	}
	if sums[0] != sums[1] {
		t.Errorf("two builds of the probe image differ: %s and %s", sums[0], sums[1])
	}
}

// TestRunCommands runs each command line the node tests give the probe pod: fetch
// prints and records a line per URL and ends (it once fell through to serve and never
// ended), and a bad line is an error, not a server.
func TestRunCommands(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	termLog := filepath.Join(t.TempDir(), "termination-log")
	var out strings.Builder
	if err := run([]string{"fetch", srv.URL, srv.URL + "/b"}, &out, termLog); err != nil {
		t.Fatalf("probe fetch: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], srv.URL+" 200 OK connect=") || !strings.HasPrefix(lines[1], srv.URL+"/b 200 OK connect=") {
		t.Errorf("probe fetch printed %q", out.String())
	}
	if b, err := os.ReadFile(termLog); err != nil || string(b) != out.String() {
		t.Errorf("termination message %q (%v), want what was printed", b, err)
	}

	closed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	closed.Close()
	// One URL that does not answer: the others are still fetched and reported.
	out.Reset()
	if err := run([]string{"fetch", closed.URL, srv.URL}, &out, termLog); err == nil || !strings.Contains(err.Error(), "1 of 2 URLs") {
		t.Errorf("probe fetch with a closed URL: %v, want 1 of 2 URLs failing", err)
	}
	if got := out.String(); !strings.Contains(got, closed.URL+" error: ") || !strings.Contains(got, srv.URL+" 200 OK connect=") {
		t.Errorf("probe fetch with a closed URL printed %q", got)
	}
	for _, args := range [][]string{
		{"chroot", "/"},
		{"chroot", filepath.Join(t.TempDir(), "none"), "true"},
		{"fetch"},
		{"fetch", closed.URL},
		{"fetch", "ftp://x"},
		{"resolve"},
		{"resolve", "localhost", "192.0.2.1"},
		{"restart"},
		{"serve", "-nosuchflag"},
		{"devices", "extra"},
		{"devices", "-1s"},
		{"devices", "1s", "2s"},
	} {
		if err := run(args, io.Discard, termLog); err == nil {
			t.Errorf("probe %q: no error", args)
		}
	}
	out.Reset()
	if err := run([]string{"resolve", "localhost", "127.0.0.1"}, &out, termLog); err != nil || !strings.Contains(out.String(), "127.0.0.1") {
		t.Errorf("probe resolve localhost: %q %v", out.String(), err)
	}
}

// TestFetchPatience: with --patience, a URL whose server starts late is tried again
// until it answers, and the line says how many tries it took; one that never answers
// fails once the patience has run out; a bad patience is an error.
func TestFetchPatience(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	started := make(chan error, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		l, err := net.Listen("tcp", addr)
		started <- err
		if err == nil {
			srv.Serve(l)
		}
	}()
	defer srv.Close()
	termLog := filepath.Join(t.TempDir(), "termination-log")
	var out strings.Builder
	if err := run([]string{"fetch", "--patience", "30s", "http://" + addr + "/"}, &out, termLog); err != nil {
		t.Fatalf("probe fetch --patience 30s of a server that starts after 1.5 s: %v (%s)", err, out.String())
	}
	if err := <-started; err != nil {
		t.Fatalf("the late server: %v", err)
	}
	if !regexp.MustCompile(`^http://\S+ 200 OK \(after [2-9]\d* tries\) connect=\S+\n$`).MatchString(out.String()) {
		t.Errorf("probe fetch --patience printed %q, want the answer after 2 or more tries", out.String())
	}
	srv.Close()

	out.Reset()
	start := time.Now()
	err = run([]string{"fetch", "--patience", "2s", "http://" + addr + "/"}, &out, termLog)
	if err == nil || !strings.Contains(out.String(), "error: ") || !strings.Contains(out.String(), "tries)") {
		t.Errorf("probe fetch --patience 2s of a closed port: %v, printed %q; want a failure after several tries", err, out.String())
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("probe fetch --patience 2s gave up after %s", took)
	}
	for _, args := range [][]string{{"fetch", "--patience"}, {"fetch", "--patience", "soon", "http://x/"}, {"fetch", "--patience", "-1s", "http://x/"}, {"fetch", "--patience", "1s"}} {
		if err := run(args, io.Discard, termLog); err == nil {
			t.Errorf("probe %q: no error", args)
		}
	}
}

// TestHold: hold passes while one connection carries every request, and fails when
// the server drops it (here: answers "Connection: close"), or when there is no
// server.
func TestHold(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	termLog := filepath.Join(t.TempDir(), "termination-log")
	var out strings.Builder
	if err := run([]string{"hold", srv.URL, "300ms", "50ms"}, &out, termLog); err != nil || !strings.Contains(out.String(), "requests over one connection") {
		t.Errorf("probe hold: %q %v", out.String(), err)
	}
	if b, _ := os.ReadFile(termLog); string(b) != out.String() {
		t.Errorf("termination message %q, want %q", b, out.String())
	}
	closing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Connection", "close") }))
	defer closing.Close()
	out.Reset()
	// No transport retries quietly on a new connection: request 2 fails, saying how
	// the held connection ended.
	if err := run([]string{"hold", closing.URL, "300ms", "50ms"}, &out, termLog); err == nil ||
		!strings.Contains(out.String(), "request 2 at") || !strings.Contains(out.String(), "EOF") {
		t.Errorf("probe hold of a server that closes: %q %v, want request 2 to fail with the server's close (EOF)", out.String(), err)
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for _, args := range [][]string{{"hold", srv.URL}, {"hold", srv.URL, "soon"}, {"hold", srv.URL, "1s", "-1s"},
		{"hold", gone.URL, "1s"}, {"hold", "ftp://example.org/x", "1s"}} {
		if err := run(args, io.Discard, termLog); err == nil {
			t.Errorf("probe %q: no error", args)
		}
	}
}

// devices lists the nvidia* nodes with their numbers and only the NVIDIA_ and
// GPURACK_ variables, sorted.
func TestDevices(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mknod(filepath.Join(dir, "nvidia1"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		testreq.Missing(t, "mknod: "+err.Error(), "run the tests as root")
	}
	for _, name := range []string{"nvidiactl", "null"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := devices(dir, []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "GPURACK_SIMULATED_GPUS=true"})
	if err != nil {
		t.Fatal(err)
	}
	want := dir + "/nvidia1 c 1:3\n" + dir + "/nvidiactl ----------\nGPURACK_SIMULATED_GPUS=true\nNVIDIA_VISIBLE_DEVICES=void\n"
	if got != want {
		t.Errorf("devices:\n%s\nwant:\n%s", got, want)
	}
	if _, err := devices(filepath.Join(dir, "none"), nil); err == nil {
		t.Error("devices of a missing directory: no error")
	}
}

func TestCatLeavesTheFileAsTerminationMessage(t *testing.T) {
	dir := t.TempDir()
	src, term := filepath.Join(dir, "nf_conntrack"), filepath.Join(dir, "termination-log")
	want := "entries  searched found new invalid\n00000002  00000000 00000000 00000000 00000005\n"
	if err := os.WriteFile(src, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"cat", src}, &out, term); err != nil {
		t.Fatalf("probe cat: %v", err)
	}
	if got, _ := os.ReadFile(term); string(got) != want || out.String() != want {
		t.Errorf("probe cat: termination message %q, stdout %q, want %q", got, out.String(), want)
	}
	if err := os.WriteFile(src, bytes.Repeat([]byte("x"), 4097), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"cat", src}, &out, term); err == nil || !strings.Contains(err.Error(), "4096") {
		t.Errorf("probe cat of 4097 bytes: %v, want the termination message's bound named", err)
	}
}

// TestMem reads this test process's own memory as probe mem reads the agent's on a
// node: the totals, and a breakdown in which the test binary's text is resident.
func TestMem(t *testing.T) {
	self, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	term := filepath.Join(t.TempDir(), "termination-log")
	var out bytes.Buffer
	if err := run([]string{"mem", strings.TrimSpace(string(self))}, &out, term); err != nil {
		t.Fatalf("probe mem %s: %v", self, err)
	}
	text := out.String()
	if !regexp.MustCompile(`pid \d+: VmRSS \d+\.\d MiB, VmHWM \d+\.\d MiB, RssAnon \d+\.\d MiB, RssFile \d+\.\d MiB\n`).MatchString(text) ||
		!regexp.MustCompile(`\n  binary text +\d+\.\d MiB\n`).MatchString(text) ||
		!strings.Contains(text, "anonymous (Go heap, stacks)") {
		t.Errorf("probe mem printed:\n%s", text)
	}
	if got, _ := os.ReadFile(term); string(got) != text {
		t.Errorf("termination message %q, want what was printed", got)
	}
	if err := run([]string{"mem", "no-such-process"}, io.Discard, term); err == nil || !strings.Contains(err.Error(), "no process named") {
		t.Errorf("probe mem no-such-process: %v", err)
	}
}

func TestSmapsByMapping(t *testing.T) {
	smaps := `00400000-00800000 r-xp 00000000 00:1f 12 /usr/bin/gpuagent
Size:               4096 kB
Rss:                5734 kB
00800000-00c00000 r--p 00400000 00:1f 12 /usr/bin/gpuagent
Rss:                1024 kB
00c00000-00c10000 rw-p 00800000 00:1f 12 /usr/bin/gpuagent
Rss:                  64 kB
c000000000-c004000000 rw-p 00000000 00:00 0 
Rss:               10240 kB
7f0000000000-7f0000001000 r--p 00000000 00:1f 40 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   8 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  16 kB
7ffd00100000-7ffd00101000 r--p 00000000 00:00 0                          [vvar]
Rss:                   0 kB
`
	got, err := smapsByMapping(strings.NewReader(smaps), "/usr/bin/gpuagent")
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{"anonymous (Go heap, stacks)", 10240}, {"binary text", 5734}, {"binary rodata", 1024}, {"binary data", 64}, {"[stack]", 16}, {"libc.so.6", 8}}
	if !slices.Equal(got, want) {
		t.Errorf("smapsByMapping:\n got %v\nwant %v", got, want)
	}
	if _, err := smapsByMapping(strings.NewReader("00400000-00800000 r-xp\nRss: 1 kB\n"), "x"); err == nil {
		t.Error("a short mapping line: no error")
	}
	if _, err := smapsByMapping(strings.NewReader("00400000-00800000 r-xp 0 0 0\nRss: x kB\n"), "x"); err == nil {
		t.Error("a bad Rss: no error")
	}
}

// TestWriteVerify: write leaves data and its sha256, verify passes on it and fails,
// naming both sums, once a byte changed.
func TestWriteVerify(t *testing.T) {
	dir := t.TempDir()
	file, term := filepath.Join(dir, "blob"), filepath.Join(dir, "term")
	var out bytes.Buffer
	if err := run([]string{"write", file, "2"}, &out, term); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"verify", file}, &out, term); err != nil {
		t.Fatalf("verify after write: %v", err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'x', 'y', 'z'}, 1<<20)
	f.Close()
	if err := run([]string{"verify", file}, &out, term); err == nil || !strings.Contains(err.Error(), ".sha256 says") {
		t.Errorf("verify of changed data: %v", err)
	}
	if err := run([]string{"write", file, "zero"}, &out, term); err == nil {
		t.Error("write of a non-number of MiB passed")
	}
}

// TestBench: bench writes and reads in both directories, RUNS times each, alternating,
// and ends with the medians and their ratio; a file system without O_DIRECT is an error.
func TestBench(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	var out bytes.Buffer
	if err := run([]string{"bench", a, b, "3", "2"}, &out, filepath.Join(t.TempDir(), "term")); err != nil {
		t.Fatalf("bench on %s: %v (a file system without O_DIRECT?)", a, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 14 || !strings.HasPrefix(lines[0], "bench A write 1 ") || !strings.HasPrefix(lines[2], "bench B write 1 ") ||
		!regexp.MustCompile(`^median read A [0-9.]+ B [0-9.]+ ratio [0-9.]+$`).MatchString(lines[13]) {
		t.Errorf("bench output:\n%s", out.String())
	}
}

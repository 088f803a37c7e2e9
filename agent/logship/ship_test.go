package logship

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
)

// podsTree is a /var/log/pods-like folder the test writes container logs into.
type podsTree struct {
	t    testing.TB
	root string
}

// path is ROOT/<ns>_<pod>_<uid>/<container>/0.log, its folder made.
func (p podsTree) path(ns, pod, container string) string {
	dir := filepath.Join(p.root, ns+"_"+pod+"_"+"0b0e8b8e-0000-4000-8000-"+fmt.Sprintf("%012d", len(pod)), container)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	return filepath.Join(dir, "0.log")
}

// write appends CRI lines (each "STREAM TAG MSG") to path.
func (p podsTree) write(path string, lines ...string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(time.Now().UTC().Format(time.RFC3339Nano) + " " + l + "\n")
	}
	if _, err := f.WriteString(b.String()); err != nil {
		p.t.Fatal(err)
	}
}

// runShipper runs Run until the test ends (or stop is called), returning stop.
func runShipper(t testing.TB, cfg Config) (stop func()) {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(cfg.FlushTimeout + 20*time.Second):
			t.Errorf("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// waitFor polls cond every 50 ms for up to 30 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestShipsContainerLogsToVictoriaLogs ships a /var/log/pods-like tree into a real
// victoria-logs and reads it back: fields, a 1 MiB line cut and counted, partial lines
// joined, a rotation followed, a flood bounded with the drop counter matching what is
// missing in the store.
func TestShipsContainerLogsToVictoriaLogs(t *testing.T) {
	vl := startVictoriaLogs(t)
	pods := podsTree{t: t, root: t.TempDir()}
	web := pods.path("shop", "web-7d9f", "nginx")
	huge := strings.Repeat("x", 1<<20)
	pods.write(web, "stdout F GET / 200", "stderr F upstream slow",
		"stdout P first-", "stdout P second-", "stdout F third",
		"stdout F "+huge)
	m := &Metrics{}
	const queueLines = 1000
	cfg := Config{URL: vl.URL, Node: "gpu-r1-07", BootID: "b00710000000400080000000000000aa", PodsDir: pods.root,
		StateFile: filepath.Join(t.TempDir(), "logship.json"), QueueLines: queueLines, PollEvery: 100 * time.Millisecond,
		FlushEvery: 200 * time.Millisecond, Metrics: m, Backoff: retry.Backoff{First: 100 * time.Millisecond, Max: time.Second}}
	stop := runShipper(t, cfg)
	waitFor(t, "the first four lines shipped", func() bool { return m.Shipped("container") == 4 })

	web2 := `source:container AND pod:"web-7d9f"`
	vl.waitCount(t, web2, 4)
	rows, err := vl.rows(web2+` AND stream:stderr`, 1)
	if err != nil || len(rows) != 1 {
		t.Fatalf("stderr line: %v, %v", rows, err)
	}
	r := rows[0]
	for k, want := range map[string]string{"_msg": "upstream slow", "namespace": "shop", "pod": "web-7d9f", "container": "nginx",
		"node": "gpu-r1-07", "boot_id": cfg.BootID, "source": "container", "stream": "stderr"} {
		if r[k] != want {
			t.Errorf("stderr line field %s = %q, want %q (row %v)", k, r[k], want, r)
		}
	}
	if _, ok := r["_time"]; !ok {
		t.Errorf("row without _time: %v", r)
	}
	vl.waitCount(t, web2+` AND _msg:="first-second-third"`, 1)
	rows, err = vl.rows(web2+` AND truncated:true`, 1)
	if err != nil || len(rows) != 1 || rows[0]["_msg"] != huge[:DefaultMaxLine] {
		t.Fatalf("the 1 MiB line: %d rows (error %v), want one cut to %d bytes", len(rows), err, DefaultMaxLine)
	}
	if got := m.Truncated("container"); got != 1 {
		t.Errorf("truncated counter %d, want 1", got)
	}

	// A rotation: the old file gets a last line, is renamed away, a new one starts.
	pods.write(web, "stdout F before-rotation")
	if err := os.Rename(web, web+".20261204-221500"); err != nil {
		t.Fatal(err)
	}
	pods.write(web, "stdout F after-rotation")
	vl.waitCount(t, web2+` AND (_msg:="before-rotation" OR _msg:="after-rotation")`, 2)

	// A flood: far more lines than the queue holds, read in one poll.
	const flood = 20 * queueLines
	lines := make([]string, flood)
	for i := range lines {
		lines[i] = fmt.Sprintf("stdout F flood line %06d %s", i, strings.Repeat("y", 80))
	}
	// Written aside and renamed into place, so that one poll reads it all (a poll in
	// the middle of a 2 MB write would see part of it, and the sender would make room).
	spam := pods.path("shop", "spam-1", "loud")
	pods.write(spam+".tmp", lines...)
	if err := os.Rename(spam+".tmp", spam); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the flood read and shipped", func() bool {
		n, _ := m.q.Load().length()
		return m.Shipped("container")+m.Dropped(DropQueueFull) == 4+2+flood && n == 0
	})
	dropped := int(m.Dropped(DropQueueFull))
	if dropped < flood-queueLines {
		t.Errorf("dropped %d flood lines; with a queue of %d lines read in one poll, want at least %d", dropped, queueLines, flood-queueLines)
	}
	vl.waitCount(t, `pod:"spam-1"`, flood-dropped)
	if pl, pb := m.q.Load().peak(); pl > queueLines || pb > DefaultQueueBytes {
		t.Errorf("queue peaked at %d lines, %d bytes; bounds %d, %d", pl, pb, queueLines, DefaultQueueBytes)
	}
	stop()
	t.Logf("shipped %d container lines, dropped %d of a %d-line flood (queue %d lines), truncated %d",
		m.Shipped("container"), dropped, flood, queueLines, m.Truncated("container"))
}

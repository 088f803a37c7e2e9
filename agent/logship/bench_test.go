package logship

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestLogShippingFigures (opt-in, GPURACK_BENCH_LOGS=1) measures, for docs/bench/logs.md,
// the lines per second the shipper sustains into a real victoria-logs on this machine,
// against its peer in the same run: the rate at which journalctl --output=json alone
// prints the same journal file. Three runs, alternating; then the container-log path
// (one file of the same number of lines, appearing at once, with a queue that holds it
// all). The journal runs with the default bounds: what the store does not take in time
// is dropped and counted, and reported.
func TestLogShippingFigures(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_LOGS", "a measurement of several seconds a run for docs/bench/logs.md")
	// 100,000 entries fit in one journal file of systemd-journal-remote's default size
	// (more rotate into a second file, which --file=PATH does not read).
	const n = 100000
	const nc = 300000
	jf := newJournalFile(t)
	entries := make([]map[string]string, n)
	for i := range entries {
		entries[i] = map[string]string{"MESSAGE": fmt.Sprintf("bench line %06d %s", i, strings.Repeat("m", 80)),
			"_SYSTEMD_UNIT": fmt.Sprintf("unit-%d.service", i%20), "PRIORITY": "6"}
	}
	jf.add(entries...)
	for run := 1; run <= 3; run++ {
		peer := journalctlAlone(t, jf.path, n)
		vl := startVictoriaLogs(t)
		m := &Metrics{}
		t0 := time.Now()
		stop := runShipper(t, Config{URL: vl.URL, Node: "bench", BootID: BootID(), Journalctl: "journalctl",
			JournalArgs: []string{"--file=" + jf.path}, Metrics: m, Backoff: retry.Backoff{First: 100 * time.Millisecond, Max: time.Second}})
		waitDone(t, m, "journal", n)
		d := time.Since(t0)
		stop()
		vl.waitCount(t, "source:journal", int(m.Shipped("journal")))
		t.Logf("run %d journal: journalctl alone %.0f lines/s; shipper %d shipped, %d dropped in %v: %.0f lines/s shipped (ratio %.2f)",
			run, peer, m.Shipped("journal"), m.Dropped(DropQueueFull), d.Round(time.Millisecond), float64(m.Shipped("journal"))/d.Seconds(),
			float64(m.Shipped("journal"))/d.Seconds()/peer)
	}
	for run := 1; run <= 3; run++ {
		pods := podsTree{t: t, root: t.TempDir()}
		lines := make([]string, nc)
		for i := range lines {
			lines[i] = fmt.Sprintf("stdout F bench line %06d %s", i, strings.Repeat("m", 80))
		}
		p := pods.path("bench", "writer", "main")
		pods.write(p+".tmp", lines...)
		catRate := catAlone(t, p+".tmp", nc)
		vl := startVictoriaLogs(t)
		m := &Metrics{}
		t0 := time.Now()
		// A queue that holds the whole file: this measures how fast the lines go
		// into the store, not the default bound (which drops what one poll reads past
		// 10,000 lines, as TestShipsContainerLogsToVictoriaLogs shows).
		stop := runShipper(t, Config{URL: vl.URL, Node: "bench", BootID: BootID(), PodsDir: pods.root, Metrics: m, PollEvery: 100 * time.Millisecond,
			QueueLines: nc, QueueBytes: 256 << 20})
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
		waitDone(t, m, "container", nc)
		d := time.Since(t0)
		stop()
		vl.waitCount(t, "source:container", int(m.Shipped("container")))
		t.Logf("run %d containers: reading the file alone %.0f lines/s; shipper %d shipped, %d dropped in %v: %.0f lines/s shipped",
			run, catRate, m.Shipped("container"), m.Dropped(DropQueueFull), d.Round(time.Millisecond), float64(m.Shipped("container"))/d.Seconds())
	}
}

// waitDone waits until every one of n lines of source was shipped or dropped and the
// queue is empty.
func waitDone(t *testing.T, m *Metrics, source string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		lines, _ := 0, 0
		if q := m.q.Load(); q != nil {
			lines, _ = q.length()
		}
		if m.Shipped(source)+m.Dropped(DropQueueFull) >= n && lines == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d shipped, %d dropped of %d after 5 min", source, m.Shipped(source), m.Dropped(DropQueueFull), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// journalctlAlone is the rate (lines/s) at which journalctl prints the file's n entries
// with the shipper's arguments, without --follow, read by a plain line scanner.
func journalctlAlone(t *testing.T, file string, n int) float64 {
	args := journalArgs("", []string{"--file=" + file})
	var plain []string
	for _, a := range args {
		if a != "--follow" {
			plain = append(plain, a)
		}
	}
	return timeLines(t, exec.Command("journalctl", plain...), n)
}

// catAlone is the rate at which cat reads the file's n lines.
func catAlone(t *testing.T, file string, n int) float64 {
	return timeLines(t, exec.Command("cat", file), n)
}

func timeLines(t *testing.T, cmd *exec.Cmd, n int) float64 {
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	got := 0
	for sc.Scan() {
		got++
	}
	cmd.Wait()
	d := time.Since(t0)
	if got != n {
		t.Fatalf("%s printed %d lines, want %d", filepath.Base(cmd.Path), got, n)
	}
	return float64(n) / d.Seconds()
}

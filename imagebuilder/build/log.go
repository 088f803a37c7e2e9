package build

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Reporter prints the pipeline's progress: on a terminal, one status line per stage
// rewritten in place with download progress; otherwise plain timestamped lines.
type Reporter struct {
	W     io.Writer
	TTY   bool
	mu    sync.Mutex
	stage string
	start time.Time
	last  time.Time
	n, of int
}

// NewReporter reports to w, detecting a terminal when w is *os.File.
func NewReporter(w io.Writer) *Reporter {
	r := &Reporter{W: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			r.TTY = true
		}
	}
	return r
}

// Stage starts stage n of total.
func (r *Reporter) Stage(n, total int, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLocked()
	r.stage, r.start, r.n, r.of = name, time.Now(), n, total
	if r.TTY {
		fmt.Fprintf(r.W, "[%d/%d] %s ...", n, total, name)
	} else {
		fmt.Fprintf(r.W, "%s stage %d/%d %s: start\n", time.Now().UTC().Format(time.RFC3339), n, total, name)
	}
}

func (r *Reporter) endLocked() {
	if r.stage == "" {
		return
	}
	d := time.Since(r.start).Round(100 * time.Millisecond)
	if r.TTY {
		fmt.Fprintf(r.W, "\r\033[K[%d/%d] %s done in %s\n", r.n, r.of, r.stage, d)
	} else {
		fmt.Fprintf(r.W, "%s stage %d/%d %s: done in %s\n", time.Now().UTC().Format(time.RFC3339), r.n, r.of, r.stage, d)
	}
	r.stage = ""
}

// Done ends the current stage.
func (r *Reporter) Done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLocked()
}

// Logf prints one line (above the status line on a terminal).
func (r *Reporter) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if r.TTY {
		fmt.Fprintf(r.W, "\r\033[K%s\n", msg)
		if r.stage != "" {
			fmt.Fprintf(r.W, "[%d/%d] %s ...", r.n, r.of, r.stage)
		}
		return
	}
	fmt.Fprintf(r.W, "%s %s\n", time.Now().UTC().Format(time.RFC3339), msg)
}

// Progress updates the status line (terminal only; at most 10 times a second).
func (r *Reporter) Progress(format string, args ...any) {
	if !r.TTY {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.last) < 100*time.Millisecond {
		return
	}
	r.last = time.Now()
	fmt.Fprintf(r.W, "\r\033[K[%d/%d] %s: %s", r.n, r.of, r.stage, fmt.Sprintf(format, args...))
}

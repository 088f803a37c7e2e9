package logship

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"unicode/utf8"
)

// journalLineMax bounds one line of journalctl's JSON output. Without --all journalctl
// prints no field of 4096 bytes or more (null instead), and the shipper asks for five
// fields besides the four it always prints, so an entry's line stays far below this
// even with every byte escaped; a longer one is dropped as journal_unreadable.
const journalLineMax = 256 << 10

// journalFields are the fields asked of journalctl (--output-fields): besides them it
// always prints __CURSOR, __REALTIME_TIMESTAMP, __MONOTONIC_TIMESTAMP and _BOOT_ID.
const journalFields = "MESSAGE,PRIORITY,SYSLOG_IDENTIFIER,_SYSTEMD_UNIT,_TRANSPORT"

// journalArgs are journalctl's arguments: JSON from the start of the current boot (or
// after cursor), following, with no line limit; extra come last (tests: --file=PATH).
func journalArgs(cursor string, extra []string) []string {
	args := []string{"--output=json", "--output-fields=" + journalFields, "--follow", "--no-tail", "--boot", "--quiet"}
	if cursor != "" {
		args = append(args, "--after-cursor="+cursor)
	}
	return append(args, extra...)
}

// journalReader runs journalctl and turns its output into entries.
type journalReader struct {
	command string
	extra   []string
	maxLine int
	emit    func(Entry)
	metrics *Metrics
	// cursor is the last entry read (not necessarily shipped): a journalctl restarted
	// within the same agent goes on after it.
	cursor string
}

// run runs journalctl once, until ctx ends (nil) or it exits (an error saying why).
func (j *journalReader) run(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, j.command, journalArgs(j.cursor, j.extra)...)
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", j.command, err)
	}
	j.read(ctx, out)
	err = cmd.Wait()
	if ctx.Err() != nil {
		return nil
	}
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		return fmt.Errorf("%s exited (%v): %s", j.command, err, msg)
	}
	return fmt.Errorf("%s exited: %v", j.command, err)
}

// read reads journalctl's output to its end.
func (j *journalReader) read(ctx context.Context, out io.Reader) {
	lr := newLineReader(out, journalLineMax)
	for {
		line, cut, _, err := lr.next()
		if err != nil {
			return
		}
		if cut {
			j.metrics.addDropped(DropJournalUnreadable, 1)
			continue
		}
		e, err := parseJournalEntry(line)
		if err != nil {
			j.metrics.addDropped(DropJournalUnreadable, 1)
			continue
		}
		j.cursor = e.Cursor
		if e.Omitted {
			if long, cut, ok := j.longMessage(ctx, e.Cursor); ok {
				e.Msg, e.Omitted = long, cut
			}
		}
		msg, truncated := cutMessage(e.Msg, j.maxLine)
		j.emit(Entry{Time: e.Time, Msg: msg, Source: "journal", Unit: e.Unit, Identifier: e.Identifier, Priority: e.Priority, BootID: e.BootID,
			Truncated: truncated || e.Omitted, cursor: e.Cursor})
	}
}

// cutMessage cuts s to at most max bytes, on a UTF-8 boundary.
func cutMessage(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	s = s[:max]
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				s = s[:i]
			}
			break
		}
	}
	return s, true
}

// tailBuffer keeps the last max bytes written to it (a subprocess's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if over := t.b.Len() - t.max; over > 0 {
		t.b.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}

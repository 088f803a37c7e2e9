package logquery

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Entry is one answer line: field name to value (VictoriaLogs answers strings).
type Entry map[string]string

// MaxAnswerBytes bounds what a query reads back.
const MaxAnswerBytes = 256 << 20

// Request is one query of the store's /select/logsql/query.
type Request struct {
	Query string
	// Start and End bound _time (End excluded by the store's own rule); zero: open.
	Start, End time.Time
	// Limit returns the newest Limit lines (the store sorts by _time desc and cuts);
	// 0: all.
	Limit int
}

// Form is r as the store's form arguments.
func (r Request) Form() url.Values {
	v := url.Values{}
	v.Set("query", r.Query)
	if !r.Start.IsZero() {
		v.Set("start", r.Start.UTC().Format(time.RFC3339Nano))
	}
	if !r.End.IsZero() {
		v.Set("end", r.End.UTC().Format(time.RFC3339Nano))
	}
	if r.Limit > 0 {
		v.Set("limit", strconv.Itoa(r.Limit))
	}
	return v
}

// Query posts r to base's /select/logsql/query (base: http://127.0.0.1:9429) and
// returns the entries.
func Query(ctx context.Context, client *http.Client, base string, r Request) ([]Entry, error) {
	u := strings.TrimSuffix(base, "/") + "/select/logsql/query"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(r.Form().Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the log store at %s: %w (is victoria-logs running? `controlplane-bootstrap status`)", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("the log store refused the query (HTTP %d): %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	return ParseEntries(io.LimitReader(resp.Body, MaxAnswerBytes))
}

// ParseEntries reads JSON lines of string (or scalar) fields.
func ParseEntries(r io.Reader) ([]Entry, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var out []Entry
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var raw map[string]any
		if err := json.Unmarshal(line, &raw); err != nil {
			return out, fmt.Errorf("answer line %d: %v", n, err)
		}
		e := make(Entry, len(raw))
		for k, v := range raw {
			switch v := v.(type) {
			case string:
				e[k] = v
			case nil:
			default:
				b, _ := json.Marshal(v)
				e[k] = string(b)
			}
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read the answer: %w", err)
	}
	return out, nil
}

// SortByTime orders entries by _time, oldest first (RFC 3339 times of one zone sort
// as strings only with equal precision, so they are parsed).
func SortByTime(es []Entry) {
	key := func(e Entry) time.Time {
		t, _ := time.Parse(time.RFC3339Nano, e["_time"])
		return t
	}
	slices.SortStableFunc(es, func(a, b Entry) int { return key(a).Compare(key(b)) })
}

// FormatText writes one line per entry: time (UTC, milliseconds), node, where the line
// came from (the unit, or namespace/pod/container), and the message; a cut line ends
// in " [truncated]".
func FormatText(w io.Writer, es []Entry) error {
	bw := bufio.NewWriter(w)
	for _, e := range es {
		ts := e["_time"]
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			ts = t.UTC().Format("2006-01-02T15:04:05.000Z")
		}
		where := e["unit"]
		if e["source"] == "container" || e["pod"] != "" {
			where = e["namespace"] + "/" + e["pod"] + "/" + e["container"]
		}
		if where == "" {
			where = "-"
		}
		msg := strings.ReplaceAll(e["_msg"], "\n", `\n`)
		if e["truncated"] == "true" {
			msg += " [truncated]"
		}
		fmt.Fprintf(bw, "%s %s %s %s\n", ts, orDash(e["node"]), where, msg)
	}
	return bw.Flush()
}

// FormatBoots writes the BootsQuery answer as a table.
func FormatBoots(w io.Writer, es []Entry) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%-24s %-32s %-24s %-24s %s\n", "NODE", "BOOT", "FIRST", "LAST", "LINES")
	for _, e := range es {
		fmt.Fprintf(bw, "%-24s %-32s %-24s %-24s %s\n", orDash(e["node"]), orDash(e["boot_id"]), shortTime(e["first"]), shortTime(e["last"]), orDash(e["lines"]))
	}
	return bw.Flush()
}

// FormatJSON writes one JSON object per entry.
func FormatJSON(w io.Writer, es []Entry) error {
	enc := json.NewEncoder(w)
	for _, e := range es {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}

func shortTime(s string) string {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC().Format("2006-01-02T15:04:05Z")
	}
	return orDash(s)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

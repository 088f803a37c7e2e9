package logship

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// journalEntry is what the shipper keeps of one entry of `journalctl --output=json`
// (systemd's JSON export format, https://systemd.io/JOURNAL_EXPORT_FORMATS/): one JSON
// object a line, every field a string; a field that is not valid UTF-8 (or has control
// characters) is an array of byte values, a field given twice in one entry an array of
// its values, and a field of 4096 bytes or more is null unless journalctl runs with
// --all (it does not: see decision 0695).
type journalEntry struct {
	Cursor string
	Time   time.Time
	BootID string
	Unit   string
	// Identifier is SYSLOG_IDENTIFIER (journalctl -t): a pod's or a script's logger
	// lines have the container's scope as their unit, and only this says who wrote them.
	Identifier string
	Priority   string
	Msg        string
	// Omitted: journalctl printed null for the message (4096 bytes or more).
	Omitted bool
}

// omittedMessage stands for a journal message journalctl left out as too long.
const omittedMessage = "[gpuagent: journal message of 4096 bytes or more, left out by journalctl --output=json]"

// parseJournalEntry parses one line of `journalctl --output=json`. An entry without a
// cursor or a valid __REALTIME_TIMESTAMP is an error: the shipper could not resume
// after it, nor place it in time.
func parseJournalEntry(line []byte) (journalEntry, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return journalEntry{}, fmt.Errorf("journal entry is not a JSON object: %w", err)
	}
	var e journalEntry
	e.Cursor, _ = journalField(raw["__CURSOR"])
	if e.Cursor == "" {
		return journalEntry{}, fmt.Errorf("journal entry without __CURSOR")
	}
	ts, _ := journalField(raw["__REALTIME_TIMESTAMP"])
	usec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || usec < 0 {
		return journalEntry{}, fmt.Errorf("journal entry %s: __REALTIME_TIMESTAMP %q is not microseconds since the epoch", e.Cursor, ts)
	}
	e.Time = time.UnixMicro(usec).UTC()
	e.BootID, _ = journalField(raw["_BOOT_ID"])
	e.Unit, _ = journalField(raw["_SYSTEMD_UNIT"])
	e.Identifier, _ = journalField(raw["SYSLOG_IDENTIFIER"])
	if e.Unit == "" {
		e.Unit = e.Identifier
	}
	if t, _ := journalField(raw["_TRANSPORT"]); e.Unit == "" && t == "kernel" {
		e.Unit = "kernel"
	}
	e.Priority, _ = journalField(raw["PRIORITY"])
	var present bool
	e.Msg, present = journalField(raw["MESSAGE"])
	if !present && string(raw["MESSAGE"]) == "null" {
		e.Msg, e.Omitted = omittedMessage, true
	}
	return e, nil
}

// journalField decodes one field's value: a string, an array of byte values (binary),
// or an array of either (the field given several times: the values joined by
// newlines). present is false for a missing field, null or anything else.
func journalField(v json.RawMessage) (s string, present bool) {
	if len(v) == 0 || string(v) == "null" {
		return "", false
	}
	if err := json.Unmarshal(v, &s); err == nil {
		return s, true
	}
	if b, ok := journalBytes(v); ok {
		return b, true
	}
	var many []json.RawMessage
	if err := json.Unmarshal(v, &many); err != nil || len(many) == 0 {
		return "", false
	}
	parts := make([]string, 0, len(many))
	for _, m := range many {
		var p string
		if json.Unmarshal(m, &p) != nil {
			var ok bool
			if p, ok = journalBytes(m); !ok {
				return "", false
			}
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "\n"), true
}

// journalBytes decodes an array of byte values, replacing what is not UTF-8.
func journalBytes(v json.RawMessage) (string, bool) {
	var nums []int
	if err := json.Unmarshal(v, &nums); err != nil {
		return "", false
	}
	b := make([]byte, len(nums))
	for i, n := range nums {
		if n < 0 || n > 255 {
			return "", false
		}
		b[i] = byte(n)
	}
	if !utf8.Valid(b) {
		return strings.ToValidUTF8(string(b), "\uFFFD"), true
	}
	return string(b), true
}

package logship

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"unicode/utf8"
)

// longMessage reads again a journal entry whose message journalctl left out (4096 bytes
// or more): `journalctl --all --output=json --output-fields=MESSAGE --cursor=C` prints
// it first, and only the first maxJSON bytes of that line are read (the rest is never
// held) before journalctl is stopped. It returns the message's first bytes decoded,
// whether it was cut, and false when the message could not be read (gone from the
// journal, binary, journalctl failing): the caller then ships the marker.
func (j *journalReader) longMessage(ctx context.Context, cursor string) (msg string, cut, ok bool) {
	args := append([]string{"--all", "--output=json", "--output-fields=MESSAGE", "--quiet", "--cursor=" + cursor}, j.extra...)
	cmd := exec.CommandContext(ctx, j.command, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", false, false
	}
	if err := cmd.Start(); err != nil {
		return "", false, false
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lr := newLineReader(out, j.maxLine+longMessageSlack)
	line, _, _, err := lr.next()
	if err != nil || !bytes.Contains(line, []byte(`"__CURSOR":"`+cursor+`"`)) {
		return "", false, false
	}
	i := bytes.Index(line, []byte(`"MESSAGE":"`))
	if i < 0 {
		return "", false, false
	}
	s, complete := decodeJSONStringPrefix(line[i+len(`"MESSAGE":"`):])
	msg, cutHere := cutMessage(s, j.maxLine)
	return msg, cutHere || !complete, true
}

// longMessageSlack is room beside the message in the re-read line: the cursor, the boot
// id, the timestamps and their names.
const longMessageSlack = 1024

// decodeJSONStringPrefix decodes the JSON string whose text (after its opening quote)
// starts b, as far as b goes: complete is true when its closing quote was found. A cut
// escape at the end is left out; invalid escapes end the string there (not complete).
func decodeJSONStringPrefix(b []byte) (s string, complete bool) {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			return string(out), true
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			break
		}
		switch e := b[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
			i += 2
		case 'b', 'f', 'n', 'r', 't':
			out = append(out, map[byte]byte{'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}[e])
			i += 2
		case 'u':
			r, n := decodeUnicodeEscape(b[i:])
			if n == 0 {
				return strToValid(out), false
			}
			out = utf8.AppendRune(out, r)
			i += n
		default:
			return strToValid(out), false
		}
	}
	return strToValid(out), false
}

// decodeUnicodeEscape decodes \uXXXX (and a following \uXXXX low surrogate) at the start
// of b: the rune and the bytes used, 0 when b is cut or not an escape.
func decodeUnicodeEscape(b []byte) (rune, int) {
	if len(b) < 6 {
		return 0, 0
	}
	v, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	if err != nil {
		return 0, 0
	}
	r := rune(v)
	if r >= 0xD800 && r < 0xDC00 { // a high surrogate: its pair follows
		if len(b) < 12 || b[6] != '\\' || b[7] != 'u' {
			return utf8.RuneError, 6
		}
		lo, err := strconv.ParseUint(string(b[8:12]), 16, 16)
		if err != nil || lo < 0xDC00 || lo > 0xDFFF {
			return utf8.RuneError, 6
		}
		return (r-0xD800)<<10 | (rune(lo) - 0xDC00) + 0x10000, 12
	}
	if r >= 0xDC00 && r <= 0xDFFF {
		return utf8.RuneError, 6
	}
	return r, 6
}

func strToValid(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
}

package logship

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os/exec"
	"unicode/utf8"
)

// longMessage reads again a journal entry whose message journalctl left out (4096 bytes
// or more): `journalctl --all --output=export --output-fields=MESSAGE --cursor=C` prints
// that entry first. The export format is read, not JSON, because its order is fixed:
// __CURSOR comes first, so the entry is known before its message is read. (JSON's field
// order is not: a cursor printed after a long message was never reached, and the
// message was shipped as the marker.) Only the message's first maxLine bytes are read,
// the rest is never held, before journalctl is stopped. It returns the message decoded
// (invalid UTF-8 replaced), whether it was cut, and false when the entry could not be
// read (gone from the journal, journalctl failing): the caller then ships the marker.
func (j *journalReader) longMessage(ctx context.Context, cursor string) (msg string, cut, ok bool) {
	args := append([]string{"--all", "--output=export", "--output-fields=MESSAGE", "--quiet", "--cursor=" + cursor}, j.extra...)
	cmd := exec.CommandContext(ctx, j.command, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", false, false
	}
	if err := cmd.Start(); err != nil {
		return "", false, false
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	return readExportMessage(bufio.NewReaderSize(out, 4096), cursor, j.maxLine)
}

// exportNameMax bounds a field's name in the export format (journald's own bound is 64);
// exportFieldMax bounds the fields read before MESSAGE (cursor, timestamps, boot id).
const (
	exportNameMax  = 256
	exportFieldMax = 1024
)

var errExportFormat = errors.New("not journal export format")

// readExportMessage reads the first entry of journalctl's export format
// (https://systemd.io/JOURNAL_EXPORT_FORMATS/): its first field must be __CURSOR with
// the value cursor; its MESSAGE, text (NAME=value\n) or binary (NAME\n, a 64-bit
// little-endian length, the value, \n), is returned cut to max bytes on a UTF-8
// boundary, with cut set when anything was left. ok is false for another entry, an entry
// without MESSAGE, or input that is not the export format.
func readExportMessage(r *bufio.Reader, cursor string, max int) (msg string, cut, ok bool) {
	for first := true; ; first = false {
		name, binaryValue, err := readExportName(r)
		if err != nil || name == "" {
			return "", false, false
		}
		if name == "MESSAGE" && !first {
			// utf8.UTFMax more than max, so a rune cut by the read is past the cut below.
			raw, more, err := readExportValue(r, binaryValue, max+utf8.UTFMax)
			if err != nil {
				return "", false, false
			}
			msg, cutHere := cutMessage(strToValid(raw), max)
			return msg, cutHere || more, true
		}
		value, more, err := readExportValue(r, binaryValue, exportFieldMax)
		if err != nil || more || (first && (name != "__CURSOR" || string(value) != cursor)) {
			return "", false, false
		}
	}
}

// readExportName reads a field's name up to its '=' (a text value follows) or its
// newline (a binary value follows); an empty line, the entry's end, gives "".
func readExportName(r *bufio.Reader) (name string, binaryValue bool, err error) {
	var b []byte
	for len(b) <= exportNameMax {
		c, err := r.ReadByte()
		if err != nil {
			return "", false, err
		}
		switch c {
		case '=':
			if len(b) == 0 {
				return "", false, errExportFormat
			}
			return string(b), false, nil
		case '\n':
			return string(b), len(b) > 0, nil
		}
		b = append(b, c)
	}
	return "", false, errExportFormat
}

// readExportValue reads a value of at most limit bytes: more is set (and the rest left
// unread) when the value is longer.
func readExportValue(r *bufio.Reader, binaryValue bool, limit int) (value []byte, more bool, err error) {
	if !binaryValue {
		for {
			frag, err := r.ReadSlice('\n')
			complete := err == nil
			if complete {
				frag = frag[:len(frag)-1]
			} else if err != bufio.ErrBufferFull {
				return nil, false, err
			}
			if room := limit - len(value); len(frag) > room {
				return append(value, frag[:room]...), true, nil
			}
			value = append(value, frag...)
			if complete {
				return value, false, nil
			}
		}
	}
	var size uint64
	if err := binary.Read(r, binary.LittleEndian, &size); err != nil {
		return nil, false, err
	}
	n := min(size, uint64(limit))
	value = make([]byte, n)
	if _, err := io.ReadFull(r, value); err != nil {
		return nil, false, err
	}
	if size > n {
		return value, true, nil
	}
	if c, err := r.ReadByte(); err != nil || c != '\n' {
		return nil, false, errExportFormat
	}
	return value, false, nil
}

func strToValid(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
}

// Package linewriter is an io.Writer for a child process's output: it keeps all of it
// (for the error message when the process fails) and hands each complete line to a
// callback (progress on a terminal, a counter).
package linewriter

import (
	"bytes"
	"strings"
)

// Writer appends everything to Buf and calls Line, if set, with each complete line
// (without its newline). A final line without a newline is kept in Buf only.
type Writer struct {
	Buf  *bytes.Buffer
	Line func(string)
	cur  []byte
}

func (w *Writer) Write(b []byte) (int, error) {
	w.Buf.Write(b)
	w.cur = append(w.cur, b...)
	for {
		i := bytes.IndexByte(w.cur, '\n')
		if i < 0 {
			break
		}
		if w.Line != nil {
			w.Line(string(w.cur[:i]))
		}
		w.cur = w.cur[i+1:]
	}
	return len(b), nil
}

// Tail returns the last n lines of s, for an error message about a failed process.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

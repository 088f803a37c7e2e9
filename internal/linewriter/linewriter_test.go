package linewriter

import (
	"bytes"
	"slices"
	"testing"
)

func TestLinesAcrossWrites(t *testing.T) {
	var buf bytes.Buffer
	var lines []string
	w := &Writer{Buf: &buf, Line: func(l string) { lines = append(lines, l) }}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\nthree"))
	if want := []string{"one", "two"}; !slices.Equal(lines, want) {
		t.Errorf("lines %q, want %q", lines, want)
	}
	if buf.String() != "one\ntwo\nthree" {
		t.Errorf("kept %q", buf.String())
	}
	(&Writer{Buf: &buf}).Write([]byte("no callback\n")) // Line is optional
}

func TestTail(t *testing.T) {
	if got := Tail("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail("a", 5); got != "a" {
		t.Errorf("Tail of one line = %q", got)
	}
}

package logship

import (
	"bufio"
	"io"
)

// lineReader reads newline-terminated lines with a bound: a line longer than max bytes
// is returned cut to max, with cut set, and the rest of it is read and thrown away, so
// a line of any length never sits in memory whole (at most max bytes plus the bufio
// buffer). A line not yet ended at EOF (a writer mid-line) is kept, also bounded, and
// completed by later reads: next returns io.EOF until its newline arrives.
type lineReader struct {
	r   *bufio.Reader
	max int
	// buf is the line so far (at most max bytes); cut says bytes were thrown away;
	// read is how many bytes of input the line has used so far, newline included.
	buf  []byte
	cut  bool
	read int64
}

// readBufSize is the bufio buffer: the most read from the input in one call.
const readBufSize = 32 << 10

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, readBufSize), max: max}
}

// next returns the next complete line without its newline, whether it was cut, and how
// many input bytes it used (its offset advance). line is valid until the next call.
// At the end of the input it returns io.EOF (any other read error as it is); an
// unfinished line stays pending for the next call.
func (l *lineReader) next() (line []byte, cut bool, used int64, err error) {
	for {
		frag, err := l.r.ReadSlice('\n')
		l.read += int64(len(frag))
		complete := len(frag) > 0 && frag[len(frag)-1] == '\n'
		if complete {
			frag = frag[:len(frag)-1]
		}
		if room := l.max - len(l.buf); len(frag) > room {
			l.buf = append(l.buf, frag[:room]...)
			l.cut = true
		} else {
			l.buf = append(l.buf, frag...)
		}
		if complete {
			line, cut, used = l.buf, l.cut, l.read
			l.buf, l.cut, l.read = l.buf[:0], false, 0
			return line, cut, used, nil
		}
		if err != bufio.ErrBufferFull {
			return nil, false, 0, err
		}
	}
}

// pending is how many bytes of an unfinished line were read.
func (l *lineReader) pending() int64 { return l.read }

package logship

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// tailer follows the container log files under a /var/log/pods-like root: every
// ROOT/<ns>_<pod>_<uid>/<container>/<n>.log. Each poll finds new files, reads every
// open file to its end, and follows a rotation (kubelet renames N.log away and starts
// a new one: the old file is read to its end first) and a truncation (read again from
// the start).
type tailer struct {
	root    string
	maxLine int
	// emit takes each line; it must not block.
	emit  func(Entry)
	files map[string]*tailFile
	// saved is where shipping got to before a restart (path -> inode, offset).
	saved map[string]fileState
	log   *slog.Logger
}

// tailFile is one open container log file.
type tailFile struct {
	key    fileKey
	f      *os.File
	lr     *lineReader
	offset int64 // after the last complete line read
	who    podLog
	// A partial (P) line being joined: its text so far (at most maxLine), whether
	// some was cut, its first fragment's time and stream.
	partial       []byte
	partialCut    bool
	partialOpen   bool
	partialTime   time.Time
	partialStream string
}

func newTailer(root string, maxLine int, saved map[string]fileState, emit func(Entry), log *slog.Logger) *tailer {
	return &tailer{root: root, maxLine: maxLine, emit: emit, files: map[string]*tailFile{}, saved: saved, log: log}
}

// poll reads what was written since the last poll.
func (t *tailer) poll() {
	paths, _ := filepath.Glob(filepath.Join(t.root, "*", "*", "*.log"))
	seen := make(map[string]bool, len(paths))
	for _, p := range paths {
		seen[p] = true
		ino, ok := inodeOf(p)
		if !ok {
			continue
		}
		tf := t.files[p]
		if tf != nil && tf.key.inode != ino { // rotated: finish the old file first
			t.read(tf)
			tf.f.Close()
			delete(t.files, p)
			tf = nil
		}
		if tf == nil {
			if tf = t.open(p, ino); tf == nil {
				continue
			}
			t.files[p] = tf
		}
		if fi, err := tf.f.Stat(); err == nil && fi.Size() < tf.offset+tf.lr.pending() { // truncated
			tf.f.Seek(0, io.SeekStart)
			tf.offset, tf.lr = 0, newLineReader(tf.f, t.maxLine+criPrefixMax)
		}
		t.read(tf)
	}
	for p, tf := range t.files {
		if !seen[p] { // removed (the pod went): what is left was read at the last poll
			t.read(tf)
			tf.f.Close()
			delete(t.files, p)
		}
	}
}

// criPrefixMax is room for a CRI line's timestamp, stream and tags beside the message.
const criPrefixMax = 128

// open opens path at the saved offset when the saved inode is this one, else at 0.
func (t *tailer) open(path string, ino uint64) *tailFile {
	who, ok := parsePodLogPath(path)
	if !ok {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			t.log.Warn("container log not readable", "path", path, "error", err)
		}
		return nil
	}
	tf := &tailFile{key: fileKey{path: path, inode: ino}, f: f, who: who}
	if s, ok := t.saved[path]; ok && s.Inode == ino {
		if _, err := f.Seek(s.Offset, io.SeekStart); err == nil {
			tf.offset = s.Offset
		}
	}
	tf.lr = newLineReader(f, t.maxLine+criPrefixMax)
	return tf
}

// read reads tf to its current end.
func (t *tailer) read(tf *tailFile) {
	for {
		line, cut, used, err := tf.lr.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.log.Warn("reading container log", "path", tf.key.path, "error", err)
			}
			return
		}
		tf.offset += used
		t.line(tf, line, cut)
	}
}

// line handles one CRI line: a full line is emitted, a partial one joined (up to
// maxLine) with those after it until the full one that ends it.
func (t *tailer) line(tf *tailFile, raw []byte, cut bool) {
	c, ok := parseCRILine(raw)
	if !ok { // not CRI: ship it as it is
		c = criLine{Time: time.Now().UTC(), Msg: raw}
	}
	if !tf.partialOpen {
		tf.partial, tf.partialCut, tf.partialTime, tf.partialStream = tf.partial[:0], false, c.Time, c.Stream
	}
	if room := t.maxLine - len(tf.partial); len(c.Msg) > room {
		tf.partial = append(tf.partial, c.Msg[:room]...)
		tf.partialCut = true
	} else {
		tf.partial = append(tf.partial, c.Msg...)
	}
	tf.partialCut = tf.partialCut || cut
	if c.Partial {
		tf.partialOpen = true
		return
	}
	tf.partialOpen = false
	t.emit(Entry{Time: tf.partialTime, Msg: string(tf.partial), Source: "container", Namespace: tf.who.Namespace,
		Pod: tf.who.Pod, Container: tf.who.Container, Stream: tf.partialStream, Truncated: tf.partialCut,
		file: tf.key, offset: tf.offset})
	if cap(tf.partial) > 64<<10 { // do not keep a large buffer for every file
		tf.partial = nil
	}
}

// close closes every open file.
func (t *tailer) close() {
	for p, tf := range t.files {
		tf.f.Close()
		delete(t.files, p)
	}
}

func inodeOf(path string) (uint64, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}

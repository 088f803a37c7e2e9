package logship

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParseCRILine(t *testing.T) {
	ts := time.Date(2026, 12, 4, 22, 15, 0, 123456789, time.UTC)
	cases := []struct {
		line        string
		ok, partial bool
		stream, msg string
	}{
		{"2026-12-04T22:15:00.123456789Z stdout F hello world", true, false, "stdout", "hello world"},
		{"2026-12-04T22:15:00.123456789Z stderr P part ", true, true, "stderr", "part "},
		{"2026-12-04T22:15:00.123456789Z stdout F", true, false, "stdout", ""},
		{"2026-12-04T22:15:00.123456789Z stdout F:x msg", true, false, "stdout", "msg"},
		{"2026-12-04T22:15:00.123456789Z stdout F  two spaces", true, false, "stdout", " two spaces"},
		{"2026-12-04T22:15:00.123456789Z stdin F x", false, false, "", ""},
		{"2026-12-04T22:15:00.123456789Z stdout X x", false, false, "", ""},
		{"yesterday stdout F x", false, false, "", ""},
		{"plain text line", false, false, "", ""},
		{"", false, false, "", ""},
	}
	for _, c := range cases {
		got, ok := parseCRILine([]byte(c.line))
		if ok != c.ok {
			t.Errorf("%q: ok %v, want %v", c.line, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if got.Partial != c.partial || got.Stream != c.stream || string(got.Msg) != c.msg || !got.Time.Equal(ts) {
			t.Errorf("%q: %+v (msg %q), want partial %v stream %s msg %q at %s", c.line, got, got.Msg, c.partial, c.stream, c.msg, ts)
		}
	}
}

func FuzzParseCRILine(f *testing.F) {
	for _, s := range []string{"2026-12-04T22:15:00.123456789Z stdout F hello", "2026-12-04T22:15:00Z stderr P ", "x y z", "", "2026-12-04T22:15:00Z stdout F:a:b m"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		c, ok := parseCRILine(line)
		if !ok {
			return
		}
		if c.Stream != "stdout" && c.Stream != "stderr" {
			t.Fatalf("stream %q", c.Stream)
		}
		if len(c.Msg) > len(line) || !bytes.HasSuffix(line, c.Msg) {
			t.Fatalf("message %q is not the end of %q", c.Msg, line)
		}
	})
}

func TestParsePodLogPath(t *testing.T) {
	cases := []struct {
		path string
		ok   bool
		want podLog
	}{
		{"/var/log/pods/kube-system_coredns-7c65d6cfc9-abcde_1f0e4c0a-7b2d-4d3e-9f00-0123456789ab/coredns/0.log", true,
			podLog{"kube-system", "coredns-7c65d6cfc9-abcde", "1f0e4c0a-7b2d-4d3e-9f00-0123456789ab", "coredns"}},
		{"/var/log/pods/ns_pod_uid/c/12.log", true, podLog{"ns", "pod", "uid", "c"}},
		{"/var/log/pods/ns_pod/c/0.log", false, podLog{}},
		{"/var/log/pods/ns_pod_uid_x/c/0.log", false, podLog{}},
		{"/var/log/pods/ns__uid/c/0.log", false, podLog{}},
		{"/var/log/pods/ns_pod_uid/c/0.log.20261204-221500", false, podLog{}},
		{"0.log", false, podLog{}},
	}
	for _, c := range cases {
		got, ok := parsePodLogPath(c.path)
		if ok != c.ok || got != c.want {
			t.Errorf("%s: %+v %v, want %+v %v", c.path, got, ok, c.want, c.ok)
		}
	}
}

func FuzzParsePodLogPath(f *testing.F) {
	for _, s := range []string{"/var/log/pods/ns_pod_uid/c/0.log", "a_b_c/d/e.log", "/", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		p, ok := parsePodLogPath(path)
		if ok && (p.Namespace == "" || p.Pod == "" || p.UID == "" || p.Container == "" || strings.Contains(p.Namespace+p.Pod+p.UID, "_")) {
			t.Fatalf("%q: %+v", path, p)
		}
	})
}

// A journalctl --output=json line as the tests' journalctl printed it (systemd 252).
const recordedJournalLine = `{"_BOOT_ID":"297701e8a7c243dd807608e0e333d7a5","PRIORITY":"6","__REALTIME_TIMESTAMP":"1796422825840346","MESSAGE":"hello one","__CURSOR":"s=901ea8fae62b4c1986168b7b6c3066a5;i=1;b=297701e8a7c243dd807608e0e333d7a5;m=3e8;t=661d648668eda;x=4a1dee0a5fd0c2ce","SYSLOG_IDENTIFIER":"kubelet","_SYSTEMD_UNIT":"kubelet.service","__MONOTONIC_TIMESTAMP":"1000"}`

func TestParseJournalEntry(t *testing.T) {
	e, err := parseJournalEntry([]byte(recordedJournalLine))
	if err != nil {
		t.Fatal(err)
	}
	if e.Unit != "kubelet.service" || e.Identifier != "kubelet" || e.Priority != "6" || e.Msg != "hello one" || e.BootID != "297701e8a7c243dd807608e0e333d7a5" ||
		!e.Time.Equal(time.UnixMicro(1796422825840346)) || !strings.HasPrefix(e.Cursor, "s=901ea8") || e.Omitted {
		t.Errorf("%+v", e)
	}
	cases := []struct {
		line, msg, unit string
		omitted         bool
		err             string
	}{
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":null,"SYSLOG_IDENTIFIER":"big"}`, omittedMessage, "big", true, ""},
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":[98,97,100,32,255]}`, "bad \ufffd", "", false, ""},
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":["one",[116,119,111]],"_SYSTEMD_UNIT":["a.service","b.service"]}`, "one\ntwo", "a.service\nb.service", false, ""},
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":[300]}`, "", "", false, ""},
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":"NVRM: Xid 79","_TRANSPORT":"kernel"}`, "NVRM: Xid 79", "kernel", false, ""},
		{`{"__REALTIME_TIMESTAMP":"1","MESSAGE":"x"}`, "", "", false, "without __CURSOR"},
		{`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"soon","MESSAGE":"x"}`, "", "", false, "__REALTIME_TIMESTAMP"},
		{`[1,2]`, "", "", false, "not a JSON object"},
	}
	for _, c := range cases {
		e, err := parseJournalEntry([]byte(c.line))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil || e.Msg != c.msg || e.Unit != c.unit || e.Omitted != c.omitted {
			t.Errorf("%s: %+v, %v; want msg %q unit %q omitted %v", c.line, e, err, c.msg, c.unit, c.omitted)
		}
	}
}

func FuzzParseJournalEntry(f *testing.F) {
	f.Add([]byte(recordedJournalLine))
	f.Add([]byte(`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":null}`))
	f.Add([]byte(`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":[98,255]}`))
	f.Add([]byte(`{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":["a",[98]]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := parseJournalEntry(line)
		if err != nil {
			return
		}
		if e.Cursor == "" {
			t.Fatalf("entry without a cursor from %q", line)
		}
		if len(e.Msg) > 2*len(line)+len(omittedMessage) {
			t.Fatalf("message of %d bytes from a line of %d", len(e.Msg), len(line))
		}
	})
}

func TestCutMessage(t *testing.T) {
	s, cut := cutMessage("ab€", 4) // € is 3 bytes: cut inside it
	if s != "ab" || !cut {
		t.Errorf("%q %v", s, cut)
	}
	if s, cut := cutMessage("abc", 3); s != "abc" || cut {
		t.Errorf("%q %v", s, cut)
	}
}

func FuzzCutMessage(f *testing.F) {
	f.Add("ab€d", 3)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || !utf8.ValidString(s) {
			return
		}
		got, cut := cutMessage(s, n)
		if len(got) > n || !strings.HasPrefix(s, got) || cut != (len(s) > n) || !utf8.ValidString(got) {
			t.Fatalf("cutMessage(%q, %d) = %q, %v", s, n, got, cut)
		}
	})
}

// The line reader never holds a line longer than its bound: a 1 MiB line comes out cut,
// and the reader's buffer stays near the bound.
func TestLineReaderBound(t *testing.T) {
	const max = 64 << 10
	in := "short\n" + strings.Repeat("x", 1<<20) + "\nafter\nunfinished"
	lr := newLineReader(strings.NewReader(in), max)
	var lines []string
	var cuts []bool
	var used int64
	for {
		line, cut, n, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if cap(lr.buf) > 2*max {
			t.Fatalf("reader buffer grew to %d bytes, bound %d", cap(lr.buf), max)
		}
		lines, cuts, used = append(lines, string(line)), append(cuts, cut), used+n
	}
	if len(lines) != 3 || lines[0] != "short" || len(lines[1]) != max || !cuts[1] || cuts[0] || lines[2] != "after" {
		t.Fatalf("%d lines, cut %v", len(lines), cuts)
	}
	if want := int64(len(in) - len("unfinished")); used != want || lr.pending() != int64(len("unfinished")) {
		t.Errorf("used %d bytes with %d pending, want %d and %d", used, lr.pending(), want, len("unfinished"))
	}
}

// An unfinished line at the end is completed by what is written after.
func TestLineReaderCompletesAcrossEOF(t *testing.T) {
	r, w := io.Pipe()
	lr := newLineReader(&eofReader{r: r}, 16)
	go func() { w.Write([]byte("abc")); w.Write([]byte("def\n")); w.Close() }()
	for i := 0; ; i++ {
		line, _, n, err := lr.next()
		if err == io.EOF && i < 1000 {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(line) != "abcdef" || n != 7 {
			t.Fatalf("%q (%d bytes)", line, n)
		}
		return
	}
}

// eofReader answers io.EOF after each chunk, as a file being written does.
type eofReader struct {
	r      io.Reader
	toggle bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	e.toggle = !e.toggle
	if !e.toggle {
		return 0, io.EOF
	}
	return e.r.Read(p)
}

// exportEntry is one entry in journalctl's export format: the cursor, then each field
// as text or, when binary is set, in the length-prefixed form.
func exportEntry(cursor string, fields [][2]string, binaryFields bool) []byte {
	var b bytes.Buffer
	b.WriteString("__CURSOR=" + cursor + "\n__REALTIME_TIMESTAMP=1796433579827690\n")
	for _, f := range fields {
		if !binaryFields {
			b.WriteString(f[0] + "=" + f[1] + "\n")
			continue
		}
		b.WriteString(f[0] + "\n")
		binary.Write(&b, binary.LittleEndian, uint64(len(f[1])))
		b.WriteString(f[1] + "\n")
	}
	b.WriteString("\n")
	return b.Bytes()
}

func TestReadExportMessage(t *testing.T) {
	const cursor = "s=5de2;i=1;b=2977;m=3e8;t=661d;x=7d73"
	cases := []struct {
		name    string
		in      []byte
		max     int
		want    string
		cut, ok bool
	}{
		{"text", exportEntry(cursor, [][2]string{{"_BOOT_ID", "2977"}, {"MESSAGE", "hello"}}, false), 64, "hello", false, true},
		{"binary", exportEntry(cursor, [][2]string{{"MESSAGE", "two\nlines \xff"}}, true), 64, "two\nlines \uFFFD", false, true},
		{"cut text", exportEntry(cursor, [][2]string{{"MESSAGE", strings.Repeat("w", 100)}}, false), 10, strings.Repeat("w", 10), true, true},
		{"cut binary", exportEntry(cursor, [][2]string{{"MESSAGE", strings.Repeat("b", 100)}}, true), 10, strings.Repeat("b", 10), true, true},
		{"cut inside a rune", exportEntry(cursor, [][2]string{{"MESSAGE", "abcdefghi\u00e9\u00e9"}}, false), 10, "abcdefghi", true, true},
		{"another entry", exportEntry("s=other", [][2]string{{"MESSAGE", "hello"}}, false), 64, "", false, false},
		{"cursor not first", []byte("MESSAGE=hello\n__CURSOR=" + cursor + "\n\n"), 64, "", false, false},
		{"no message", exportEntry(cursor, [][2]string{{"PRIORITY", "6"}}, false), 64, "", false, false},
		{"binary length past the end", []byte("__CURSOR=" + cursor + "\nMESSAGE\n\xff\xff\xff\xff\xff\xff\xff\x7fab"), 64, "", false, false},
		{"empty", nil, 64, "", false, false},
	}
	for _, c := range cases {
		got, cut, ok := readExportMessage(bufio.NewReader(bytes.NewReader(c.in)), cursor, c.max)
		if got != c.want || cut != c.cut || ok != c.ok {
			t.Errorf("%s: %q %v %v, want %q %v %v", c.name, got, cut, ok, c.want, c.cut, c.ok)
		}
	}
}

// Any input: no panic, and a message is valid UTF-8 within its bound; an entry made of
// any UTF-8 message reads back as that message (cut at the bound), in text and binary
// form.
func FuzzReadExportMessage(f *testing.F) {
	f.Add([]byte("__CURSOR=c\nMESSAGE=hi\n\n"), "hello", 8)
	f.Add([]byte("__CURSOR=c\nMESSAGE\n\x02\x00\x00\x00\x00\x00\x00\x00hi\n\n"), "two\nlines \u00e9", 11)
	f.Fuzz(func(t *testing.T, data []byte, message string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		msg, _, ok := readExportMessage(bufio.NewReader(bytes.NewReader(data)), "c", max)
		if ok && (!utf8.ValidString(msg) || len(msg) > max) {
			t.Fatalf("%q: message %q (bound %d)", data, msg, max)
		}
		if !utf8.ValidString(message) {
			return // invalid bytes are replaced, and a run of them cut differently reads differently
		}
		want, wantCut := cutMessage(message, max)
		for _, binaryForm := range []bool{false, true} {
			if !binaryForm && strings.ContainsRune(message, '\n') {
				continue
			}
			in := exportEntry("c", [][2]string{{"MESSAGE", message}}, binaryForm)
			got, cut, ok := readExportMessage(bufio.NewReader(bytes.NewReader(in)), "c", max)
			if !ok || got != want || (wantCut && !cut) {
				t.Fatalf("%q (binary %v, bound %d): %q %v %v, want %q", message, binaryForm, max, got, cut, ok, want)
			}
		}
	})
}

package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStreamAndReport runs the real `go test -json` on a small module with a passing,
// a failing (with subtests) and a skipped test, and checks what stream prints (the
// failing test's output, not the passing one's; the package lines), the rows, and the
// report's table and closing line.
func TestStreamAndReport(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := writeFile(filepath.Join(dir, name), s); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.test/s\n\ngo 1.24\n")
	write("s_test.go", `package s
import ("testing"; "time")
func TestQuiet(t *testing.T) { t.Log("quiet-output"); time.Sleep(300 * time.Millisecond) }
func TestLoud(t *testing.T) {
	t.Run("a", func(t *testing.T) {})
	t.Run("b", func(t *testing.T) { t.Error("loud-failure") })
}
func TestLater(t *testing.T) { t.`+"SkipNow"+`() }
`)
	cmd := exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	js, _ := cmd.Output() // exits 1: TestLoud fails
	var out, rows, fails bytes.Buffer
	if err := stream(bytes.NewReader(js), &out, &rows, &fails); err != nil {
		t.Fatal(err)
	}
	o := out.String()
	if !strings.Contains(o, "loud-failure") || !strings.Contains(o, "FAIL\texample.test/s") {
		t.Errorf("stream printed:\n%s\nwant the failing package's output and its FAIL line", o)
	}
	// A package that passes prints its ok line alone.
	write("s_test.go", `package s
import "testing"
func TestQuiet(t *testing.T) { t.Log("quiet-output") }
`)
	cmd = exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	pass, _ := cmd.Output()
	var passOut bytes.Buffer
	if err := stream(bytes.NewReader(pass), &passOut, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(passOut.String(), "quiet-output") || !strings.HasPrefix(passOut.String(), "ok  \texample.test/s") {
		t.Errorf("a passing package printed:\n%s\nwant its ok line alone", passOut.String())
	}
	rs, err := readRows(&rows)
	if err != nil {
		t.Fatal(err)
	}
	var rep bytes.Buffer
	report(&rep, rs, 15, fails.String(), "FAILURES")
	r := rep.String()
	lines := strings.Split(strings.TrimSpace(r), "\n")
	if last := lines[len(lines)-1]; last != "1 passed, 1 failed, 1 skipped" {
		t.Errorf("closing line %q, want 1 passed, 1 failed, 1 skipped\n%s", last, r)
	}
	if i, j := strings.Index(r, "TestQuiet"), strings.Index(r, "TestLoud"); i < 0 || j < 0 || i > j {
		t.Errorf("the slowest test (TestQuiet, 0.3 s) is not listed first:\n%s", r)
	}
	// The failing subtest's own last lines are repeated before the closing line, not the
	// passing test's.
	before, failed, ok := strings.Cut(r, "what the failing tests printed last:")
	if !ok || !strings.Contains(failed, "FAIL example.test/s TestLoud/b, its last lines:") || !strings.Contains(failed, "loud-failure") || strings.Contains(r, "quiet-output") {
		t.Errorf("the failing tests' last lines:\n%s", r)
	}
	if strings.Contains(before, "TestLoud/b") {
		t.Errorf("subtests are listed:\n%s", r)
	}
	// A test that never finishes (the package times out): its output is printed.
	write("s_test.go", `package s
import ("testing"; "time")
func TestHangs(t *testing.T) { t.Log("hang-output"); time.Sleep(time.Minute) }
`)
	cmd = exec.Command("go", "test", "-json", "-count=1", "-timeout", "1s", ".")
	cmd.Dir = dir
	js, _ = cmd.Output()
	out.Reset()
	if err := stream(bytes.NewReader(js), &out, &rows, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "hang-output") || !strings.Contains(out.String(), "test timed out") {
		t.Errorf("a timed-out test's output is not printed:\n%s", out.String())
	}
	// A package that fails with every test passing (TestMain's exit code) is named
	// at the end of the report.
	write("s_test.go", `package s
import ("os"; "testing")
func TestMain(m *testing.M) { m.Run(); os.Exit(3) }
func TestFine(t *testing.T) {}
`)
	cmd = exec.Command("go", "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	js, _ = cmd.Output()
	var exitRows bytes.Buffer
	if err := stream(bytes.NewReader(js), io.Discard, &exitRows, io.Discard); err != nil {
		t.Fatal(err)
	}
	ers, err := readRows(&exitRows)
	if err != nil {
		t.Fatal(err)
	}
	rep.Reset()
	report(&rep, ers, 15, "", "")
	if r := rep.String(); !strings.Contains(r, "package failed: example.test/s") || !strings.Contains(r, "1 passed, 0 failed") {
		t.Errorf("a package failing with no failing test is not named:\n%s", r)
	}
	if _, err := readRows(strings.NewReader("a\tb\n")); err == nil {
		t.Error("a malformed durations file was read")
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

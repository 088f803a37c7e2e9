// Command testsummary reads `go test -json` and keeps what `make test` needs from it:
// the package lines a plain `go test` prints, everything a failing package printed (as
// `go test -v` would show it), and each test's duration, so the run ends with the slowest
// tests and the totals (docs/testing.md, "The CI budget").
//
//	go test -json ./... | testsummary stream --out DURATIONS.tsv   (appends)
//	testsummary report DURATIONS.tsv                               (the table)
//
// DURATIONS.tsv has one row per finished test or package: package, test ("" for the
// package), result (pass, fail, skip), seconds. Beside it, DURATIONS.tsv.failures gets
// the last lines each failing test printed, which the report repeats at its end: a log
// cut to its head and tail (CI's excerpt) still says what failed.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "stream":
		fs := flag.NewFlagSet("stream", flag.ExitOnError)
		out := fs.String("out", "", "append each test's duration to this file (required)")
		fs.Parse(os.Args[2:])
		if *out == "" {
			usage()
		}
		err = streamTo(*out)
	case "report":
		fs := flag.NewFlagSet("report", flag.ExitOnError)
		top := fs.Int("top", 15, "how many of the slowest tests to list")
		fs.Parse(os.Args[2:])
		if fs.NArg() != 1 {
			usage()
		}
		err = reportFile(fs.Arg(0), *top)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  go test -json PKGS | testsummary stream --out FILE   print what go test would, append durations to FILE
  testsummary report [--top N] FILE                    the N slowest tests (default 15), totals, "N passed, N failed"`)
	os.Exit(2)
}

func streamTo(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	ff, err := os.OpenFile(path+failuresSuffix, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		f.Close()
		return err
	}
	w, fw := bufio.NewWriter(f), bufio.NewWriter(ff)
	err = stream(os.Stdin, os.Stdout, w, fw)
	for _, e := range []error{w.Flush(), fw.Flush(), f.Close(), ff.Close()} {
		if err == nil {
			err = e
		}
	}
	return err
}

// failuresSuffix names the file of the failing tests' last lines, beside the durations.
const failuresSuffix = ".failures"

// failTail is how many of a failing test's last lines are kept, each cut to
// failLineMax bytes; the report repeats at most failReportMax lines of them.
const (
	failTail      = 12
	failLineMax   = 300
	failReportMax = 150
)

// tailLines keeps a test's last failTail lines of its own output, without go test's
// "=== RUN" and "--- PASS/FAIL" lines.
type tailLines []string

func (t *tailLines) add(line string) {
	if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "=== ") || strings.HasPrefix(trimmed, "--- ") {
		return
	}
	line = strings.TrimRight(line, "\n")
	if len(line) > failLineMax {
		line = line[:failLineMax] + " [cut]"
	}
	if *t = append(*t, line); len(*t) > failTail {
		*t = (*t)[1:]
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// stream copies the human part of the events in r to out, a package at a time when it
// finishes: for a package that passed, its own lines ("ok  pkg  1.2s"); for one that
// failed, everything its tests printed, in order, then its own lines (as go test -v
// would print it: test2json attributes a line to the test it believes was running, which
// is not always the one that printed it, so a failure's output is never cut to one
// test's). Build output is copied as it comes. Each finished test and package is a row
// in rows; each failing test's last lines go to fails. A line that is not an event (go
// test's own error before any package ran) is copied as it is.
func stream(r io.Reader, out, rows, fails io.Writer) error {
	type pkgOut struct{ all, own []string }
	held := map[string]*pkgOut{}
	tails := map[[2]string]*tailLines{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		p := held[e.Package]
		if p == nil {
			p = &pkgOut{}
			held[e.Package] = p
		}
		switch e.Action {
		case "output":
			p.all = append(p.all, e.Output)
			if e.Test != "" {
				k := [2]string{e.Package, e.Test}
				if tails[k] == nil {
					tails[k] = &tailLines{}
				}
				tails[k].add(e.Output)
			}
			if e.Test == "" && !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
				p.own = append(p.own, e.Output)
			}
		case "build-output":
			io.WriteString(out, e.Output)
		case "pass", "fail", "skip":
			fmt.Fprintf(rows, "%s\t%s\t%s\t%.2f\n", e.Package, e.Test, e.Action, e.Elapsed)
			if e.Test != "" {
				k := [2]string{e.Package, e.Test}
				if t := tails[k]; e.Action == "fail" && t != nil && len(*t) > 0 {
					fmt.Fprintf(fails, "FAIL %s %s, its last lines:\n%s\n", e.Package, e.Test, strings.Join(*t, "\n"))
				}
				delete(tails, k)
				continue
			}
			if e.Action == "fail" {
				io.WriteString(out, strings.Join(p.all, ""))
			} else {
				io.WriteString(out, strings.Join(p.own, ""))
			}
			delete(held, e.Package)
		}
	}
	// Packages that never finished (go test killed): what they printed.
	for _, p := range held {
		io.WriteString(out, strings.Join(p.all, ""))
	}
	return sc.Err()
}

// row is one line of the durations file.
type row struct {
	pkg, test, result string
	seconds           float64
}

func reportFile(path string, top int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := readRows(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fails, err := os.ReadFile(path + failuresSuffix)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	report(os.Stdout, rows, top, string(fails), path+failuresSuffix)
	return nil
}

// reportFailures repeats the failing tests' last lines, at most failReportMax of them.
func reportFailures(w io.Writer, fails, path string) {
	if fails == "" {
		return
	}
	lines := strings.Split(strings.TrimRight(fails, "\n"), "\n")
	fmt.Fprintln(w, "what the failing tests printed last:")
	for _, l := range lines[:min(failReportMax, len(lines))] {
		fmt.Fprintln(w, "  "+l)
	}
	if len(lines) > failReportMax {
		fmt.Fprintf(w, "  ... %d more lines in %s\n", len(lines)-failReportMax, path)
	}
}

func readRows(r io.Reader) ([]row, error) {
	var rows []row
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: %d fields, want 4 (package, test, result, seconds)", n, len(f))
		}
		s, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: seconds %q: %w", n, f[3], err)
		}
		rows = append(rows, row{f[0], f[1], f[2], s})
	}
	if len(rows) == 0 && sc.Err() == nil {
		return nil, errors.New("no tests recorded")
	}
	return rows, sc.Err()
}

// report prints the top slowest top-level tests, the slowest packages, the sum of the
// package times, the failing tests' last lines (fails, kept in failsPath), and the
// closing line counting top-level tests.
func report(w io.Writer, rows []row, top int, fails, failsPath string) {
	var tests, pkgs []row
	counts := map[string]int{}
	for _, r := range rows {
		switch {
		case r.test == "":
			pkgs = append(pkgs, r)
		case !strings.Contains(r.test, "/"):
			tests = append(tests, r)
			counts[r.result]++
		}
	}
	bySeconds := func(rs []row) {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].seconds > rs[j].seconds })
	}
	bySeconds(tests)
	bySeconds(pkgs)
	var total float64
	for _, p := range pkgs {
		total += p.seconds
	}
	fmt.Fprintf(w, "\nslowest tests (of %d):\n", len(tests))
	for _, t := range tests[:min(top, len(tests))] {
		fmt.Fprintf(w, "  %8.1f s  %-4s  %s %s\n", t.seconds, t.result, t.pkg, t.test)
	}
	fmt.Fprintf(w, "slowest packages (of %d):\n", len(pkgs))
	for _, p := range pkgs[:min(5, len(pkgs))] {
		fmt.Fprintf(w, "  %8.1f s  %-4s  %s\n", p.seconds, p.result, p.pkg)
	}
	fmt.Fprintf(w, "package times add up to %.0f s\n", total)
	reportFailures(w, fails, failsPath)
	// A package can fail with no failing test (a build error, a panic after the tests,
	// TestMain's exit code): name it here, where a log's tail still shows it.
	for _, p := range pkgs {
		if p.result == "fail" {
			fmt.Fprintf(w, "package failed: %s (its output is printed above)\n", p.pkg)
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts["pass"], counts["fail"], counts["skip"])
}

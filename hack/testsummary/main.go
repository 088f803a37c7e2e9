// Command testsummary reads `go test -json` and keeps what `make test` needs from it:
// the output a plain `go test` would print (package lines, and the whole output of
// each failing test), and each test's duration, so the run ends with the slowest
// tests and the totals (docs/testing.md, "The CI budget").
//
//	go test -json ./... | testsummary stream --out DURATIONS.tsv   (appends)
//	testsummary report DURATIONS.tsv                               (the table)
//
// DURATIONS.tsv has one row per finished test or package: package, test ("" for the
// package), result (pass, fail, skip), seconds.
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
	w := bufio.NewWriter(f)
	err = stream(os.Stdin, os.Stdout, w)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// stream copies the human part of the events in r to out: package-level output and
// build output as they come, a test's own output only when it fails (as go test
// without -v prints it). Each finished test and package is a row in rows. A line that
// is not an event (go test's own error before any package ran) is copied as it is.
func stream(r io.Reader, out io.Writer, rows io.Writer) error {
	held := map[string][]string{} // package + "\x00" + top-level test → its output and its subtests'
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		topLevel, _, _ := strings.Cut(e.Test, "/")
		key := e.Package + "\x00" + topLevel
		switch e.Action {
		case "output":
			if e.Test == "" {
				if !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
					io.WriteString(out, e.Output)
				}
				continue
			}
			held[key] = append(held[key], e.Output)
		case "build-output":
			io.WriteString(out, e.Output)
		case "pass", "fail", "skip":
			if e.Test != "" && e.Test == topLevel {
				if e.Action == "fail" {
					io.WriteString(out, strings.Join(held[key], ""))
				}
				delete(held, key)
			}
			if e.Test == "" && e.Action == "fail" {
				// A package that failed with tests unfinished (a timeout's panic, a
				// crash): print what they said.
				for k, lines := range held {
					if strings.HasPrefix(k, e.Package+"\x00") {
						io.WriteString(out, strings.Join(lines, ""))
						delete(held, k)
					}
				}
			}
			fmt.Fprintf(rows, "%s\t%s\t%s\t%.2f\n", e.Package, e.Test, e.Action, e.Elapsed)
		}
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
	report(os.Stdout, rows, top)
	return nil
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
// package times, and the closing line counting top-level tests.
func report(w io.Writer, rows []row, top int) {
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
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts["pass"], counts["fail"], counts["skip"])
}

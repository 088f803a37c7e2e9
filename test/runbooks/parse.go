// Package runbooks runs the runbooks of docs/operations.md as they are written: it reads
// the fenced blocks the document tags for a runbook, in order, and its tests run each
// block's commands with bash against real parts (a control plane, gpuboot, simulated
// machines with test BMCs) in a network and mount namespace of their own, where the
// document's absolute paths (/var/lib/gpuboot, /etc/gpurack, …) are the test's
// directories. A change to the document that breaks a runbook then fails the tests.
//
// The tags are HTML comments, so they do not show where the document is rendered:
//
//	<!-- runbook: NAME [fails="TEXT"]… [retry=DURATION] [append=PATH] [instead=STANDIN] -->
//	```sh
//	commands
//	```
//	<!-- expect: REGEXP -->
//	<!-- expect-not: REGEXP -->
//	<!-- capture PLACEHOLDER: REGEXP with one group -->
//
// and, for a step the document gives in words only (an edit of a file), a marker with no
// block that names the test's stand-in for it:
//
//	<!-- runbook: NAME do=STANDIN -->
//
// This file is the parser only: pure, no I/O. What each tag does when the block runs is
// in the package's tests (docs/testing.md, "Runbooks run as written").
package runbooks

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Step is one tagged block of a runbook, or one stand-in marker.
type Step struct {
	// Line is the line of the opening fence (of the marker for Do), from 1.
	Line int
	// Section is the nearest "## " heading above the step.
	Section string
	// Lang is the fence's language ("sh", "yaml", "" for none).
	Lang string
	// Text is the block's content without the fence's indentation.
	Text string
	// Fails are texts of the commands of the block that must exit non-zero (each
	// fails= names one); every other command must exit 0 (each line runs, as pasted
	// into a shell).
	Fails []string
	// Retry, when set, runs the block again until its expectations hold or Retry
	// has passed: for steps the document says to watch.
	Retry time.Duration
	// Append names the file the block's text is appended to, instead of running it
	// (a snippet the document tells the operator to add to a file).
	Append string
	// Instead names the test's stand-in that runs in place of the block, for a
	// command that cannot run in the test (docs/testing.md lists each).
	Instead string
	// Do names the test's stand-in for a step the document gives in words; such a
	// step has no block.
	Do string
	// Expect and ExpectNot are regular expressions (multi-line mode) the block's
	// output must and must not match. They may name placeholders.
	Expect, ExpectNot []string
	// Captures maps a placeholder to a regular expression with one group: the group's
	// first match in the block's output is the placeholder's value in later steps.
	Captures []Capture
}

// Capture is one capture tag.
type Capture struct {
	Placeholder, Regexp string
}

// Runbook is the steps tagged with one name, in document order.
type Runbook struct {
	Name  string
	Steps []Step
}

// ParseError is one problem with the tags, at a line of the document.
type ParseError struct {
	Line int
	Msg  string
}

func (e *ParseError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

var (
	markerRE      = regexp.MustCompile(`^\s*<!--\s*runbook:\s*(.*?)\s*-->\s*$`)
	annotationRE  = regexp.MustCompile(`^\s*<!--\s*(expect|expect-not|capture\s+[A-Z][A-Z0-9-]*):\s?(.*?)\s*-->\s*$`)
	fenceRE       = regexp.MustCompile("^( *)(```+|~~~+)\\s*([^`\\s]*)[^`]*$")
	nameRE        = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	placeholderRE = regexp.MustCompile(`^[A-Z][A-Z0-9]*(-[A-Z0-9]+)*$`)
)

// Parse reads the runbook tags of a markdown document. Every tag problem is an error
// naming its line; untagged blocks are ignored.
func Parse(doc string) ([]Runbook, error) {
	p := parser{lines: strings.Split(doc, "\n"), byName: map[string]int{}}
	for p.i = 0; p.i < len(p.lines); p.i++ {
		p.line()
	}
	if len(p.errs) > 0 {
		return nil, p.errs[0]
	}
	return p.runbooks, nil
}

type parser struct {
	lines    []string
	i        int
	section  string
	runbooks []Runbook
	byName   map[string]int
	errs     []*ParseError
	// shared are the tags above the current one that share its block.
	shared []pendingTag
}

func (p *parser) fail(line int, format string, args ...any) {
	p.errs = append(p.errs, &ParseError{Line: line, Msg: fmt.Sprintf(format, args...)})
}

// line handles the line at p.i and whatever it starts (a marker and its block).
func (p *parser) line() {
	l := p.lines[p.i]
	if h, ok := strings.CutPrefix(l, "## "); ok {
		p.section = strings.TrimSpace(h)
		return
	}
	if m := fenceRE.FindStringSubmatch(l); m != nil {
		p.skipBlock(len(m[1]), m[2]) // an untagged block: its content is not markdown
		return
	}
	if annotationRE.MatchString(l) {
		p.fail(p.i+1, "%s follows no tagged block: put it on the lines right after the block's closing fence", strings.TrimSpace(l))
		return
	}
	m := markerRE.FindStringSubmatch(l)
	if m == nil {
		if strings.Contains(l, "runbook:") && strings.Contains(l, "<!--") {
			p.fail(p.i+1, "a runbook tag must be alone on its line: <!-- runbook: NAME key=value… -->")
		}
		return
	}
	name, st, err := parseMarker(m[1])
	st.Section, st.Line = p.section, p.i+1
	if err != nil {
		p.fail(p.i+1, "%v", err)
		return
	}
	if st.Do != "" {
		p.add(name, st)
		return
	}
	// Several runbooks may share a block: their tags stand on the lines before it, one
	// each, and each keeps its own keys.
	if p.i+1 < len(p.lines) && markerRE.MatchString(p.lines[p.i+1]) {
		if _, next, err := parseMarker(markerRE.FindStringSubmatch(p.lines[p.i+1])[1]); err == nil && next.Do == "" {
			p.shared = append(p.shared, pendingTag{name, st})
			return
		}
	}
	if p.i+1 >= len(p.lines) || fenceRE.FindStringSubmatch(p.lines[p.i+1]) == nil {
		p.fail(p.i+1, "runbook tag %q is not followed by a fenced block on the next line (or give do=STANDIN for a step in words)", m[1])
		p.shared = nil
		return
	}
	p.i++
	p.block(&st)
	p.annotations(&st)
	for _, o := range p.shared {
		if o.name == name {
			p.fail(o.step.Line, "runbook %q is tagged twice on one block", name)
		}
		shared := st
		shared.Fails, shared.Retry, shared.Append, shared.Instead = o.step.Fails, o.step.Retry, o.step.Append, o.step.Instead
		p.add(o.name, shared)
	}
	p.shared = nil
	p.add(name, st)
}

// pendingTag is a runbook tag waiting for the block it shares with the tags below it.
type pendingTag struct {
	name string
	step Step
}

func (p *parser) add(name string, st Step) {
	n, ok := p.byName[name]
	if !ok {
		n = len(p.runbooks)
		p.byName[name] = n
		p.runbooks = append(p.runbooks, Runbook{Name: name})
	}
	p.runbooks[n].Steps = append(p.runbooks[n].Steps, st)
}

// skipBlock moves p.i to the closing fence of the block opening at p.i.
func (p *parser) skipBlock(indent int, fence string) []string {
	start := p.i
	var body []string
	for p.i++; p.i < len(p.lines); p.i++ {
		l := p.lines[p.i]
		if t := strings.TrimSpace(l); strings.HasPrefix(t, fence[:1]) && strings.Trim(t, fence[:1]) == "" && len(t) >= len(fence) {
			return body
		}
		body = append(body, dedent(l, indent))
	}
	p.fail(start+1, "fenced block is not closed")
	return body
}

// block reads the tagged block opening at p.i into st.
func (p *parser) block(st *Step) {
	m := fenceRE.FindStringSubmatch(p.lines[p.i])
	st.Line, st.Lang = p.i+1, m[3]
	body := p.skipBlock(len(m[1]), m[2])
	st.Text = strings.Join(body, "\n") + "\n"
	if st.Append == "" && st.Instead == "" && st.Lang != "sh" {
		p.fail(st.Line, "a runbook block that runs must be ```sh (this one is %q); use append=PATH for a file's snippet", st.Lang)
	}
}

// annotations reads the expect, expect-not and capture comments right after the
// closing fence at p.i.
func (p *parser) annotations(st *Step) {
	for p.i+1 < len(p.lines) {
		m := annotationRE.FindStringSubmatch(p.lines[p.i+1])
		if m == nil {
			return
		}
		p.i++
		if _, err := regexp.Compile(m[2]); err != nil || m[2] == "" {
			p.fail(p.i+1, "%s: not a regular expression: %q (%v)", m[1], m[2], err)
			continue
		}
		switch kind := m[1]; {
		case kind == "expect":
			st.Expect = append(st.Expect, m[2])
		case kind == "expect-not":
			st.ExpectNot = append(st.ExpectNot, m[2])
		default:
			name := strings.TrimSpace(strings.TrimPrefix(kind, "capture"))
			if !IsPlaceholder(name) {
				p.fail(p.i+1, "capture %s: a placeholder is upper-case words joined by '-' (NEW-ID)", name)
				continue
			}
			if re := regexp.MustCompile(m[2]); re.NumSubexp() != 1 {
				p.fail(p.i+1, "capture %s: the regular expression must have exactly one group, has %d", name, re.NumSubexp())
				continue
			}
			st.Captures = append(st.Captures, Capture{Placeholder: name, Regexp: m[2]})
		}
	}
}

// parseMarker reads "NAME key=value …" of a runbook tag.
func parseMarker(s string) (string, Step, error) {
	var st Step
	fields, err := splitFields(s)
	if err != nil {
		return "", st, err
	}
	if len(fields) == 0 || !nameRE.MatchString(fields[0]) {
		return "", st, fmt.Errorf("runbook tag %q: the first word must be the runbook's name (lower case, digits, '-')", s)
	}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return "", st, fmt.Errorf("runbook tag %q: %q is not key=value", s, f)
		}
		if err := setKey(&st, k, v); err != nil {
			return "", st, fmt.Errorf("runbook tag %q: %w", s, err)
		}
	}
	if n := btoi(st.Append != "") + btoi(st.Instead != "") + btoi(st.Do != ""); n > 1 {
		return "", st, fmt.Errorf("runbook tag %q: append, instead and do exclude each other", s)
	}
	return fields[0], st, nil
}

func setKey(st *Step, k, v string) error {
	var err error
	switch k {
	case "fails":
		st.Fails = append(st.Fails, v)
	case "retry":
		st.Retry, err = time.ParseDuration(v)
		if err == nil && (st.Retry <= 0 || st.Retry > 10*time.Minute) {
			err = fmt.Errorf("retry=%s must be above 0 and at most 10m", v)
		}
	case "append":
		if !strings.HasPrefix(v, "/") {
			err = fmt.Errorf("append=%s must be an absolute path", v)
		}
		st.Append = v
	case "instead":
		st.Instead = v
	case "do":
		st.Do = v
	default:
		err = fmt.Errorf("unknown key %q (fails, retry, append, instead, do)", k)
	}
	return err
}

// splitFields splits on spaces, keeping double-quoted values (key="a b") whole and
// unquoted.
func splitFields(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if quoted {
		return nil, fmt.Errorf("runbook tag %q: a quote is not closed", s)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out, nil
}

// dedent removes up to n leading spaces.
func dedent(l string, n int) string {
	i := 0
	for i < n && i < len(l) && l[i] == ' ' {
		i++
	}
	return l[i:]
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// IsPlaceholder reports whether s can name a placeholder: upper-case words joined by
// '-', as the document writes NEW-ID or TOKEN.
func IsPlaceholder(s string) bool { return placeholderRE.MatchString(s) }

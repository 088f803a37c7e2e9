package runbooks

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// failPrefix starts the line the script's ERR trap writes for each command that exits
// non-zero.
const failPrefix = "runbook: command failed: "

var (
	wordRE   = regexp.MustCompile(`[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*`)
	failedRE = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(failPrefix) + `[^\n]*?:(\d+): exit status (\d+): (.*)$`)
)

// Substitute replaces each placeholder of values that stands as a word of its own in s
// (not inside a longer upper-case name, such as GPUBOOT in GPUBOOT_SERVER) by quote of
// its value.
func Substitute(s string, values map[string]string, quote func(string) string) string {
	if len(values) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range wordRE.FindAllStringIndex(s, -1) {
		v, ok := values[s[m[0]:m[1]]]
		if !ok || (m[0] > 0 && isWordByte(s[m[0]-1])) || (m[1] < len(s) && isWordByte(s[m[1]])) {
			continue
		}
		b.WriteString(s[last:m[0]])
		b.WriteString(quote(v))
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

func isWordByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Script returns the bash script that runs text, a step's block with its placeholders
// replaced, as an operator pasting it into a shell would: every line runs whatever the
// lines before did, each pipeline fails if any of its commands does (pipefail), and a
// trap reports every command that exits non-zero on stderr, with its line in doc.
// prelude runs first, unreported: the operator's shell setup (exports).
func Script(doc string, st Step, prelude, text string) string {
	head := "set -o pipefail\n" + prelude
	if head != "" && !strings.HasSuffix(head, "\n") {
		head += "\n"
	}
	// LINENO counts the lines before text too: the offset makes it the document's line.
	before := strings.Count(head, "\n") + 1
	trap := fmt.Sprintf(`trap 'rc=$?; echo "%s%s:$((LINENO + %d)): exit status $rc: $BASH_COMMAND" >&2' ERR`, failPrefix, doc, st.Line-before)
	return head + trap + "\n" + text
}

// Failure is one command of a block that exited non-zero.
type Failure struct {
	Line, Status int
	Command      string
}

// Failures reads the failures the script's trap reported in output.
func Failures(output string) []Failure {
	var fs []Failure
	for _, m := range failedRE.FindAllStringSubmatch(output, -1) {
		line, _ := strconv.Atoi(m[1])
		status, _ := strconv.Atoi(m[2])
		fs = append(fs, Failure{Line: line, Status: status, Command: m[3]})
	}
	return fs
}

// Judge says what is wrong with a run of st: output is its stdout and stderr together,
// exit the shell's exit status, values the placeholders known before it. It returns
// the problems (none when the step passed) and the values its captures add.
func Judge(doc string, st Step, output string, exit int, values map[string]string) (problems []string, captured map[string]string) {
	where := fmt.Sprintf("%s:%d", doc, st.Line)
	fs := Failures(output)
	failed := make([]bool, len(st.Fails))
	lines := strings.Split(st.Text, "\n")
	for _, f := range fs {
		// The trap names a pipeline by its last command: fails= may name its line.
		line := ""
		if i := f.Line - st.Line - 1; i >= 0 && i < len(lines) {
			line = lines[i]
		}
		told := false
		for i, text := range st.Fails {
			if strings.Contains(f.Command, Substitute(text, values, func(v string) string { return v })) || strings.Contains(line, text) {
				failed[i], told = true, true
			}
		}
		if !told {
			problems = append(problems, fmt.Sprintf("%s:%d: `%s` exited with status %d", doc, f.Line, f.Command, f.Status))
		}
	}
	for i, text := range st.Fails {
		if !failed[i] {
			problems = append(problems, fmt.Sprintf("%s: `%s` was to fail (fails=) and did not", where, text))
		}
	}
	if len(fs) == 0 && exit != 0 {
		problems = append(problems, fmt.Sprintf("%s: bash exited with status %d before running every command (a syntax error?)", where, exit))
	}
	quote := regexp.QuoteMeta
	for _, e := range st.Expect {
		if re, err := regexp.Compile("(?m)" + Substitute(e, values, quote)); err != nil || !re.MatchString(output) {
			problems = append(problems, fmt.Sprintf("%s: the output does not match expect: %s", where, e))
		}
	}
	for _, e := range st.ExpectNot {
		if re, err := regexp.Compile("(?m)" + Substitute(e, values, quote)); err != nil || re.MatchString(output) {
			problems = append(problems, fmt.Sprintf("%s: the output matches expect-not: %s", where, e))
		}
	}
	captured = map[string]string{}
	for _, c := range st.Captures {
		re, err := regexp.Compile("(?m)" + Substitute(c.Regexp, values, quote))
		m := []string(nil)
		if err == nil {
			m = re.FindStringSubmatch(output)
		}
		if m == nil || m[1] == "" {
			problems = append(problems, fmt.Sprintf("%s: capture %s: the output does not match %s", where, c.Placeholder, c.Regexp))
			continue
		}
		captured[c.Placeholder] = m[1]
	}
	return problems, captured
}

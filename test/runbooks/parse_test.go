package runbooks

import (
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

const sample = "# Doc\n" +
	"## First\n" +
	"<!-- runbook: alpha -->\n" +
	"```sh\n" +
	"echo one\n" +
	"```\n" +
	"<!-- expect: ^one$ -->\n" +
	"<!-- capture WORD: (o\\w+) -->\n" +
	"```sh\n" +
	"<!-- runbook: ignored inside an untagged block -->\n" +
	"```\n" +
	"## Second\n" +
	"1. Step:\n" +
	"   <!-- runbook: alpha fails=\"grep x\" retry=30s -->\n" +
	"   ```sh\n" +
	"   grep x /dev/null\n" +
	"     indented\n" +
	"   ```\n" +
	"   <!-- expect-not: error -->\n" +
	"<!-- runbook: beta do=edit-the-file -->\n" +
	"<!-- runbook: beta append=/etc/x.yaml -->\n" +
	"```yaml\n" +
	"a: 1\n" +
	"```\n"

func TestParse(t *testing.T) {
	got, err := Parse(sample)
	if err != nil {
		t.Fatal(err)
	}
	want := []Runbook{
		{Name: "alpha", Steps: []Step{
			{Line: 4, Section: "First", Lang: "sh", Text: "echo one\n", Expect: []string{"^one$"}, Captures: []Capture{{"WORD", `(o\w+)`}}},
			{Line: 15, Section: "Second", Lang: "sh", Text: "grep x /dev/null\n  indented\n", Fails: []string{"grep x"}, Retry: 30 * time.Second, ExpectNot: []string{"error"}},
		}},
		{Name: "beta", Steps: []Step{
			{Line: 20, Section: "Second", Do: "edit-the-file"},
			{Line: 22, Section: "Second", Lang: "yaml", Text: "a: 1\n", Append: "/etc/x.yaml"},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", got, want)
	}
}

// TestParseSharedBlock: tags on consecutive lines share the block below them, each
// with its own keys, and the annotations after it.
func TestParseSharedBlock(t *testing.T) {
	doc := "## S\n<!-- runbook: a retry=1m -->\n<!-- runbook: b instead=x -->\n```sh\nls\n```\n<!-- expect: ok -->\n"
	got, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []Runbook{
		{Name: "a", Steps: []Step{{Line: 4, Section: "S", Lang: "sh", Text: "ls\n", Retry: time.Minute, Expect: []string{"ok"}}}},
		{Name: "b", Steps: []Step{{Line: 4, Section: "S", Lang: "sh", Text: "ls\n", Instead: "x", Expect: []string{"ok"}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", got, want)
	}
}

// TestParseErrors: every problem with a tag names its line and what to write instead.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"<!-- runbook: a -->\ntext\n", "line 1: runbook tag \"a\" is not followed by a fenced block"},
		{"<!-- runbook: A -->\n```sh\n```\n", "the first word must be the runbook's name"},
		{"<!-- runbook: a colour=red -->\n```sh\n```\n", `unknown key "colour"`},
		{"<!-- runbook: a retry=forever -->\n```sh\n```\n", `invalid duration`},
		{"<!-- runbook: a fails=\"x -->\n```sh\n```\n", "a quote is not closed"},
		{"<!-- runbook: a do=x instead=y -->\n", "exclude each other"},
		{"<!-- runbook: a append=rel.yaml -->\n```yaml\n```\n", "must be an absolute path"},
		{"<!-- runbook: a -->\n```yaml\nx: 1\n```\n", "must be ```sh"},
		{"<!-- runbook: a -->\n```sh\nls\n", "line 2: fenced block is not closed"},
		{"text\n<!-- expect: x -->\n", "line 2: <!-- expect: x --> follows no tagged block"},
		{"<!-- runbook: a -->\n```sh\n```\n<!-- expect: ( -->\n", "line 4: expect: not a regular expression"},
		{"<!-- runbook: a -->\n```sh\n```\n<!-- capture X: no group -->\n", "must have exactly one group, has 0"},
		{"see <!-- runbook: a --> here\n", "must be alone on its line"},
		{"<!-- runbook: a -->\n<!-- runbook: a retry=1m -->\n```sh\nls\n```\n", "line 1: runbook \"a\" is tagged twice on one block"},
		{"<!-- runbook: a -->\n<!-- runbook: b -->\ntext\n", "line 2: runbook tag \"b\" is not followed by a fenced block"},
	} {
		_, err := Parse(tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.doc, err, tc.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	values := map[string]string{"OLD-ID": "abc", "ID": "x.y", "TOKEN": "gpo_1"}
	for _, tc := range []struct{ in, want string }{
		{"mv images/OLD-ID images-pruned/", "mv images/abc images-pruned/"},
		{"verify resigned/ID --pubkey", `verify resigned/x\.y --pubkey`},
		{"Bearer TOKEN\"", `Bearer gpo_1"`},
		{"$GPUBOOT_CREDENTIALS IDS NEW-ID XID TOKENS", "$GPUBOOT_CREDENTIALS IDS NEW-ID XID TOKENS"},
	} {
		if got := Substitute(tc.in, values, regexp.QuoteMeta); got != tc.want {
			t.Errorf("Substitute(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestScriptReportsDocumentLines runs a script in bash: every line runs, and each
// failing command is reported with its line in the document.
func TestScriptReportsDocumentLines(t *testing.T) {
	bash := testreq.Tool(t, "bash", "apt-get install bash")
	st := Step{Line: 40, Fails: []string{"grep -q nothing"}}
	text := "echo first\nfalse\ngrep -q nothing /dev/null\necho last\n"
	out, _ := exec.Command(bash, "-c", Script("docs/x.md", st, "export A=1\nexport B=2\n", text)).CombinedOutput()
	fs := Failures(string(out))
	want := []Failure{{Line: 42, Status: 1, Command: "false"}, {Line: 43, Status: 1, Command: "grep -q nothing /dev/null"}}
	if !reflect.DeepEqual(fs, want) || !strings.Contains(string(out), "last") {
		t.Fatalf("failures %+v, want %+v; output:\n%s", fs, want, out)
	}
	problems, _ := Judge("docs/x.md", st, string(out), 0, nil)
	if len(problems) != 1 || !strings.Contains(problems[0], "docs/x.md:42: `false` exited with status 1") {
		t.Errorf("Judge: %q", problems)
	}
}

func TestJudge(t *testing.T) {
	st := Step{Line: 7, Expect: []string{`^serial=SERIAL$`}, ExpectNot: []string{"refused"},
		Captures: []Capture{{"TOKEN", `token: (\S+)`}}}
	values := map[string]string{"SERIAL": "0A.1"}
	problems, got := Judge("d.md", st, "serial=0A.1\ntoken: gpo_x\n", 0, values)
	if len(problems) != 0 || got["TOKEN"] != "gpo_x" {
		t.Errorf("a good run: problems %q, captured %v", problems, got)
	}
	problems, _ = Judge("d.md", st, "serial=0AX1\nrefused\n", 0, values)
	if len(problems) != 3 {
		t.Errorf("a bad run: want 3 problems (expect, expect-not, capture), got %q", problems)
	}
	problems, _ = Judge("d.md", Step{Line: 3, Fails: []string{"grep"}}, "", 2, nil)
	if len(problems) != 2 {
		t.Errorf("a syntax error and a command that did not fail: got %q", problems)
	}
}

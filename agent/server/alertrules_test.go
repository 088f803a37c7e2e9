package server

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

const (
	operationsDoc = "../../docs/operations.md"
	monitoringDoc = "../../docs/monitoring.md"
	// runbookPrefix is how every runbook_url starts: a link relative to the repository
	// root, so that it names no host.
	runbookPrefix = "docs/operations.md#"
)

// severities are the values an alert's severity label may take; critical pages.
var severities = []string{"critical", "warning", "info"}

// alertRule is one alerting rule of a Prometheus rule file, with the line it starts on.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
	line        int
}

// parseAlertRules reads the alerting rules of a rule file; recording rules are left out.
func parseAlertRules(data []byte) ([]alertRule, error) {
	var f struct {
		Groups []struct {
			Rules []yaml.Node `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	var out []alertRule
	for _, g := range f.Groups {
		for i := range g.Rules {
			var r alertRule
			if err := g.Rules[i].Decode(&r); err != nil {
				return nil, fmt.Errorf("line %d: %w", g.Rules[i].Line, err)
			}
			if r.Alert != "" {
				r.line = g.Rules[i].Line
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// githubAnchor is the anchor GitHub gives a heading: lower case, every character but
// letters, marks, numbers, connector punctuation ('_'), '-' and ' ' dropped, and each
// space made '-'.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)

// markdownHeadings returns a document's ATX headings, in order, leaving out lines
// inside fenced code blocks (a shell comment there is no heading).
func markdownHeadings(md string) []string {
	var out []string
	fence := ""
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	return out
}

// githubAnchors is the set of anchors a document's headings get; GitHub suffixes a
// repeated one with -1, -2, ….
func githubAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, h := range markdownHeadings(md) {
		a := githubAnchor(h)
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		anchors[a] = true
	}
	return anchors
}

// alertRuleProblems says what an alert lacks: a severity label of severities, a
// summary, and a runbook_url of runbookPrefix whose anchor is one of anchors.
func alertRuleProblems(r alertRule, anchors map[string]bool) []string {
	var out []string
	if sev, ok := r.Labels["severity"]; !ok {
		out = append(out, "no severity label")
	} else if !slices.Contains(severities, sev) {
		out = append(out, fmt.Sprintf("severity %q is none of %v", sev, severities))
	}
	if strings.TrimSpace(r.Annotations["summary"]) == "" {
		out = append(out, "no summary annotation")
	}
	url, ok := r.Annotations["runbook_url"]
	switch {
	case !ok:
		out = append(out, "no runbook_url annotation")
	case !strings.HasPrefix(url, runbookPrefix):
		out = append(out, fmt.Sprintf("runbook_url %q does not start with %q (a relative link, no host)", url, runbookPrefix))
	case !anchors[strings.TrimPrefix(url, runbookPrefix)]:
		out = append(out, fmt.Sprintf("runbook_url %q: docs/operations.md has no heading with that anchor", url))
	}
	return out
}

// alertTestProblems says which alerts a promtool test file does not test both ways:
// at least one alert_rule_test expecting it to fire and one expecting it silent.
func alertTestProblems(alerts []string, testFile []byte) ([]string, error) {
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(testFile, &f); err != nil {
		return nil, err
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	var out []string
	for _, a := range alerts {
		if !fires[a] {
			out = append(out, a+": no test in which it fires")
		}
		if !silent[a] {
			out = append(out, a+": no test in which it stays silent")
		}
	}
	return out, nil
}

var jobMatcher = regexp.MustCompile(`\bjob\s*(=~|=)\s*"([^"]*)"`)

// undocumentedJobs lists the scrape jobs the alerts' expressions name (job="x",
// job=~"x|y") that jobs does not hold.
func undocumentedJobs(rules []alertRule, jobs map[string]bool) []string {
	var out []string
	for _, r := range rules {
		for _, m := range jobMatcher.FindAllStringSubmatch(r.Expr, -1) {
			names := []string{m[2]}
			if m[1] == "=~" {
				names = strings.Split(m[2], "|")
			}
			for _, n := range names {
				if !jobs[n] {
					out = append(out, fmt.Sprintf("%s: job %q", r.Alert, n))
				}
			}
		}
	}
	return out
}

var jobRow = regexp.MustCompile("^\\| `([a-z0-9-]+)` \\|")

// scrapeJobs reads the job names of the table in the "Scrape jobs" section of
// docs/monitoring.md: rows whose first cell is a `name`.
func scrapeJobs(md string) map[string]bool {
	jobs := map[string]bool{}
	in := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line[3:]) == "Scrape jobs"
			continue
		}
		if m := jobRow.FindStringSubmatch(line); in && m != nil {
			jobs[m[1]] = true
		}
	}
	return jobs
}

// ruleFiles are the rule files under docs/monitoring: every YAML file but the tests.
func ruleFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(monitoringDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return strings.HasSuffix(f, ".test.yaml") })
	if len(files) == 0 {
		t.Fatalf("no rule files in %s", monitoringDir)
	}
	return files
}

// shippedAlerts reads every alerting rule of every rule file, by file.
func shippedAlerts(t *testing.T) map[string][]alertRule {
	out := map[string][]alertRule{}
	for _, f := range ruleFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := parseAlertRules(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = rules
	}
	return out
}

func readDoc(t *testing.T, path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestAlertRulesHaveRunbooks: every alert of every rule file under docs/monitoring has a
// severity label, a summary and a runbook_url whose anchor is a heading of
// docs/operations.md; each has its own "### Name" runbook there, and a row in
// docs/monitoring.md.
func TestAlertRulesHaveRunbooks(t *testing.T) {
	ops := readDoc(t, operationsDoc)
	anchors := githubAnchors(ops)
	headings := markdownHeadings(ops)
	mon := readDoc(t, monitoringDoc)
	n := 0
	for file, rules := range shippedAlerts(t) {
		for _, r := range rules {
			n++
			for _, p := range alertRuleProblems(r, anchors) {
				t.Errorf("%s:%d %s: %s", file, r.line, r.Alert, p)
			}
			if !slices.Contains(headings, r.Alert) {
				t.Errorf("%s:%d %s: docs/operations.md has no runbook headed %q", file, r.line, r.Alert, r.Alert)
			}
			if !strings.Contains(mon, "`"+r.Alert+"`") {
				t.Errorf("%s:%d %s: docs/monitoring.md does not list it", file, r.line, r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("the rule files hold no alert")
	}
	t.Logf("%d alerts, each with a severity, a summary and a runbook in docs/operations.md", n)
}

// TestAlertRulesHaveTests: each rule file's alerts have promtool cases in its .test.yaml,
// one in which the alert fires and one in which it stays silent.
func TestAlertRulesHaveTests(t *testing.T) {
	for file, rules := range shippedAlerts(t) {
		if len(rules) == 0 {
			continue
		}
		data, err := os.ReadFile(strings.TrimSuffix(file, ".yaml") + ".test.yaml")
		if err != nil {
			t.Errorf("%s has alerts but no promtool tests: %v", file, err)
			continue
		}
		var names []string
		for _, r := range rules {
			names = append(names, r.Alert)
		}
		problems, err := alertTestProblems(names, data)
		if err != nil {
			t.Fatalf("%s's tests: %v", file, err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", file, p)
		}
	}
}

// TestAlertJobsAreDocumented: every scrape job an alert names is a row of
// docs/monitoring.md's "Scrape jobs", the contract the scrape configuration follows.
func TestAlertJobsAreDocumented(t *testing.T) {
	jobs := scrapeJobs(readDoc(t, monitoringDoc))
	if len(jobs) == 0 {
		t.Fatal(`docs/monitoring.md has no "Scrape jobs" table`)
	}
	for file, rules := range shippedAlerts(t) {
		for _, p := range undocumentedJobs(rules, jobs) {
			t.Errorf("%s: %s is not in docs/monitoring.md's scrape jobs", file, p)
		}
	}
}

// TestRunbookLinksResolve: every in-page link of docs/operations.md, [..](#anchor), and
// every link of docs/monitoring.md to it, (operations.md#anchor), is an anchor of one
// of its headings (which also holds githubAnchor to the links written by hand before
// it).
func TestRunbookLinksResolve(t *testing.T) {
	ops := readDoc(t, operationsDoc)
	anchors := githubAnchors(ops)
	for doc, re := range map[string]*regexp.Regexp{
		operationsDoc: regexp.MustCompile(`\]\(#([^)]+)\)`),
		monitoringDoc: regexp.MustCompile(`\]\(operations\.md#([^)]+)\)`),
	} {
		links := re.FindAllStringSubmatch(readDoc(t, doc), -1)
		if len(links) == 0 {
			t.Errorf("%s has no link to a section of docs/operations.md", doc)
		}
		for _, m := range links {
			if !anchors[m[1]] {
				t.Errorf("%s links to docs/operations.md#%s, which no heading has", doc, m[1])
			}
		}
	}
}

// TestAlertRuleChecksCatchMistakes holds the checks above to broken inputs: each case
// is a small rule file and runbook document held in memory, with what the check must
// say about it (nothing, for the good ones).
func TestAlertRuleChecksCatchMistakes(t *testing.T) {
	const doc = "# Operations\n\n## Alerts\n\n### GpurackX\n\n### Twice\n\n### Twice\n\n```sh\n# GpurackInFence\n```\n"
	rule := func(labels, annotations string) string {
		return "groups:\n  - name: g\n    rules:\n      - record: a:b\n        expr: vector(1)\n" +
			"      - alert: GpurackX\n        expr: up == 0\n        labels: {" + labels + "}\n        annotations: {" + annotations + "}\n"
	}
	const good = `severity: critical`
	const sum = `summary: s, `
	for _, tc := range []struct {
		name, labels, annotations, want string
	}{
		{"good", good, sum + `runbook_url: docs/operations.md#gpurackx`, ""},
		{"second of two equal headings", good, sum + `runbook_url: docs/operations.md#twice-1`, ""},
		{"no runbook_url", good, `summary: s`, "no runbook_url"},
		{"anchor with no heading", good, sum + `runbook_url: docs/operations.md#gpurack-x`, "no heading with that anchor"},
		{"third of two equal headings", good, sum + `runbook_url: docs/operations.md#twice-2`, "no heading with that anchor"},
		{"heading only inside a fenced block", good, sum + `runbook_url: docs/operations.md#gpurackinfence`, "no heading with that anchor"},
		{"anchor in upper case", good, sum + `runbook_url: docs/operations.md#GpurackX`, "no heading with that anchor"},
		{"absolute URL", good, sum + `runbook_url: "https://example.org/docs/operations.md#gpurackx"`, "does not start with"},
		{"another document", good, sum + `runbook_url: docs/monitoring.md#gpurackx`, "does not start with"},
		{"no severity", `team: gpu`, sum + `runbook_url: docs/operations.md#gpurackx`, "no severity label"},
		{"unknown severity", `severity: page`, sum + `runbook_url: docs/operations.md#gpurackx`, `severity "page" is none of`},
		{"no summary", good, `description: d, runbook_url: docs/operations.md#gpurackx`, "no summary"},
		{"empty summary", good, `summary: "", runbook_url: docs/operations.md#gpurackx`, "no summary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := parseAlertRules([]byte(rule(tc.labels, tc.annotations)))
			if err != nil || len(rules) != 1 || rules[0].line != 6 {
				t.Fatalf("parse: %v, %+v (want one alert, line 6)", err, rules)
			}
			got := strings.Join(alertRuleProblems(rules[0], githubAnchors(doc)), "; ")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("problems %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAlertTestAndJobChecksCatchMistakes: an alert with no silent case, one with no
// case at all and a job missing from the scrape jobs are reported; a complete test
// file and documented jobs are not.
func TestAlertTestAndJobChecksCatchMistakes(t *testing.T) {
	const tests = `tests:
  - alert_rule_test:
      - {alertname: A, exp_alerts: [{exp_labels: {severity: critical}}]}
      - {alertname: A, exp_alerts: []}
      - {alertname: B, exp_alerts: [{exp_labels: {severity: critical}}]}
`
	problems, err := alertTestProblems([]string{"A", "B", "C"}, []byte(tests))
	want := []string{"B: no test in which it stays silent", "C: no test in which it fires", "C: no test in which it stays silent"}
	if err != nil || !slices.Equal(problems, want) {
		t.Errorf("alertTestProblems = %q, %v; want %q", problems, err, want)
	}
	md := "## Scrape jobs\n\n| job | what |\n|---|---|\n| `gpuagent` | x |\n| `node` | y |\n\n## Other\n\n| `kubelet` | z |\n"
	rules := []alertRule{{Alert: "A", Expr: `up{job="gpuagent"} == 0`}, {Alert: "B", Expr: `up{job=~"node|kubelet"} == 0 or up{job = "etcd"} == 0`}}
	got := undocumentedJobs(rules, scrapeJobs(md))
	if want := []string{`B: job "kubelet"`, `B: job "etcd"`}; !slices.Equal(got, want) {
		t.Errorf("undocumentedJobs = %q, want %q", got, want)
	}
}

// TestAlertRunbookAnchors: the anchors of headings docs/operations.md has, as GitHub makes them.
func TestAlertRunbookAnchors(t *testing.T) {
	for heading, want := range map[string]string{
		"GpurackGPUUnhealthy":         "gpurackgpuunhealthy",
		"When gpuboot's host dies":    "when-gpuboots-host-dies",
		"Power control (Redfish)":     "power-control-redfish",
		"1. See what expires":         "1-see-what-expires",
		"Tenants: adding one, a b":    "tenants-adding-one-a-b",
		"Network boot with `gpuboot`": "network-boot-with-gpuboot",
		"snake_case and -dash":        "snake_case-and--dash",
	} {
		if got := githubAnchor(heading); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", heading, got, want)
		}
	}
	if got := markdownHeadings("## A ##\n    # code\n~~~\n# B\n~~~\n#C\n### D"); !slices.Equal(got, []string{"A", "D"}) {
		t.Errorf("markdownHeadings = %q", got)
	}
}

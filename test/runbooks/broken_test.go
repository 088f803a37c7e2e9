package runbooks

import (
	"fmt"
	"strings"
	"testing"
)

// brokenRunbooksFail runs copies of the operators runbook's first steps, each with a
// fault a document edit could bring, on a site of their own: the harness must fail each
// and name the line, or TestRunbooks could pass a runbook that does not work.
func (w *world) brokenRunbooksFail(t *testing.T, doc map[string]Runbook) {
	rb := doc["operators"]
	if len(rb.Steps) < 2 || !strings.Contains(rb.Steps[0].Text, "--level operator") {
		t.Fatalf("the operators runbook no longer starts with `gpuboot certs operator alice --level operator`; pick another step to break:\n%+v", rb.Steps)
	}
	s := w.newSite(t, "broken", false)
	s.setUpGpuboot(gpubootSite{})
	first := rb.Steps[0]
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"a misspelt flag", "--level", "--levle",
			fmt.Sprintf("%s:%d: `runuser -u gpuboot -- gpuboot certs operator alice --levle operator` exited with status 1", docPath, first.Line+1)},
		{"a step whose output no longer passes its check", "--level operator", "--level viewer",
			fmt.Sprintf("%s:%d: the output does not match expect: ", docPath, first.Line)},
	} {
		broken := Runbook{Name: "operators-broken", Steps: []Step{first}}
		broken.Steps[0].Text = strings.Replace(first.Text, tc.from, tc.to, 1)
		err := s.runRunbook(broken, doc[defaultsRunbook], nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: the harness answered %v; want an error containing %q", tc.name, err, tc.want)
			continue
		}
		t.Logf("%s: failed as it must:\n%v", tc.name, err)
	}
}

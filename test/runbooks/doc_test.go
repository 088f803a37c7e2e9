package runbooks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocumentTags keeps the document and the test in step, without running anything:
// every runbook the document tags is one TestRunbooks runs (or the defaults), and the
// other way round; each covered runbook's section names its test; every stand-in the
// document names is one the test has, and the test has none the document does not name.
func TestDocumentTags(t *testing.T) {
	doc := readDoc(t)
	data, err := os.ReadFile(filepath.Join("..", "..", docPath))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := doc[defaultsRunbook]; !ok {
		t.Errorf("%s tags no %q block (the exports every step's shell starts with)", docPath, defaultsRunbook)
	}
	covered := map[string]bool{}
	for _, rt := range runbookTests {
		used := map[string]bool{}
		for _, name := range rt.names() {
			covered[name] = true
			rb, ok := doc[name]
			if !ok {
				t.Errorf("runbookTests runs %q, which %s does not tag", name, docPath)
				continue
			}
			for _, st := range rb.Steps {
				if sn := st.Do + st.Instead; sn != "" {
					used[sn] = true
					if rt.standIns[sn] == nil {
						t.Errorf("%s:%d names stand-in %q, which runbookTests' %q does not have", docPath, st.Line, sn, rt.name)
					}
				}
			}
			for _, sec := range sections(rb) {
				if !strings.Contains(sectionText(string(data), sec), "TestRunbooks/"+rt.name) {
					t.Errorf("%s, section %q: runs in TestRunbooks/%s, and does not say so", docPath, sec, rt.name)
				}
			}
		}
		for name := range rt.standIns {
			if !used[name] {
				t.Errorf("runbookTests' %q has stand-in %q, which no step of the document names", rt.name, name)
			}
		}
	}
	for name, rb := range doc {
		if name != defaultsRunbook && !covered[name] {
			t.Errorf("%s:%d tags runbook %q, which runbookTests does not run", docPath, rb.Steps[0].Line, name)
		}
	}
}

// sections are the "## " sections rb's steps are in.
func sections(rb Runbook) []string {
	var out []string
	for _, st := range rb.Steps {
		if len(out) == 0 || out[len(out)-1] != st.Section {
			out = append(out, st.Section)
		}
	}
	return out
}

// sectionText is the text of the section headed "## heading", up to the next "## ".
func sectionText(doc, heading string) string {
	_, rest, ok := strings.Cut(doc, "\n## "+heading+"\n")
	if !ok {
		return ""
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

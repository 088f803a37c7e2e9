package runbooks

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary documents to the tag parser: it must never panic, a problem
// must be a ParseError at a line of the document, and what it accepts must hold what
// the runner relies on (a name, lines in the document, regular expressions that
// compile, captures with one group).
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", docPath)); err == nil {
		f.Add(string(b))
	}
	f.Add(sample)
	f.Add("<!-- runbook: a fails=\"x y\" -->\n~~~~sh\nls\n~~~~\n<!-- capture X-Y: (.) -->\n")
	f.Fuzz(func(t *testing.T, doc string) {
		lines := strings.Count(doc, "\n") + 1
		rbs, err := Parse(doc)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line < 1 || pe.Line > lines {
				t.Fatalf("error %v is not a ParseError at a line of the document (1 to %d)", err, lines)
			}
			return
		}
		for _, rb := range rbs {
			if !nameRE.MatchString(rb.Name) || len(rb.Steps) == 0 {
				t.Fatalf("runbook %q with %d steps", rb.Name, len(rb.Steps))
			}
			for _, st := range rb.Steps {
				if st.Line < 1 || st.Line > lines {
					t.Fatalf("step at line %d of a %d-line document", st.Line, lines)
				}
				for _, e := range append(append([]string{}, st.Expect...), st.ExpectNot...) {
					if _, err := regexp.Compile(e); err != nil {
						t.Fatalf("accepted expectation %q: %v", e, err)
					}
				}
				for _, c := range st.Captures {
					if re, err := regexp.Compile(c.Regexp); err != nil || re.NumSubexp() != 1 || !IsPlaceholder(c.Placeholder) {
						t.Fatalf("accepted capture %+v", c)
					}
				}
			}
		}
	})
}

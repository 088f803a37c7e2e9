package testreq

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// directSkip matches a skip that does not go through this package.
var directSkip = regexp.MustCompile(`\.Skip(f|Now)?\(|testing\.Short\(\)`)

// TestNoDirectSkips keeps the decision in this package: no other Go file in the module
// calls t.Skip, t.Skipf, t.SkipNow or testing.Short itself, because such a skip would
// pass quietly where GPURACK_NETNS_REQUIRED=1 says the test must run.
func TestNoDirectSkips(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not at %s: %v", root, err)
	}
	self, _ := filepath.Abs(".")
	var found []string
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch {
			case path == self, d.Name() == "testdata", d.Name() == "vendor", strings.HasPrefix(d.Name(), ".") && path != root:
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if !strings.HasPrefix(line, "//") && directSkip.MatchString(line) {
				rel, _ := filepath.Rel(root, path)
				found = append(found, rel+":"+strconv.Itoa(n)+": "+line)
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked only %d Go files under %s; the walk is broken", files, root)
	}
	if len(found) > 0 {
		t.Errorf("these skip without internal/testreq, so they would pass quietly under %s=1; call testreq.Missing, Tool, File, Root, Short, OptIn or NotApplicable instead:\n%s",
			RequiredEnv, strings.Join(found, "\n"))
	}
}

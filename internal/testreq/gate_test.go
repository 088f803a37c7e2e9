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

// walkModule calls fn for every Go file of the module (its path and its path from the
// module root), leaving out testdata, vendor, hidden folders and nested modules, and
// fails t when the walk finds too few files to be the whole module.
func walkModule(t *testing.T, fn func(path, rel string) error) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not at %s: %v", root, err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch {
			case d.Name() == "testdata", d.Name() == "vendor", strings.HasPrefix(d.Name(), ".") && path != root:
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
		rel, _ := filepath.Rel(root, path)
		return fn(path, filepath.ToSlash(rel))
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked only %d Go files under %s; the walk is broken", files, root)
	}
}

// directSkip matches a skip that does not go through this package.
var directSkip = regexp.MustCompile(`\.Skip(f|Now)?\(|testing\.Short\(\)`)

// TestNoDirectSkips keeps the decision in this package: no other Go file in the module
// calls t.Skip, t.Skipf, t.SkipNow or testing.Short itself, because such a skip would
// pass quietly where GPURACK_NETNS_REQUIRED=1 says the test must run.
func TestNoDirectSkips(t *testing.T) {
	self, _ := filepath.Abs(".")
	var found []string
	walkModule(t, func(path, rel string) error {
		if filepath.Dir(path) == self {
			return nil
		}
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
				found = append(found, rel+":"+strconv.Itoa(n)+": "+line)
			}
		}
		return sc.Err()
	})
	if len(found) > 0 {
		t.Errorf("these skip without internal/testreq, so they would pass quietly under %s=1; call testreq.Missing, Tool, File, Root, Short, OptIn or NotApplicable instead:\n%s",
			RequiredEnv, strings.Join(found, "\n"))
	}
}

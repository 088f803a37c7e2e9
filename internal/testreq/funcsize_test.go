package testreq

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"slices"
	"strings"
	"testing"
)

// Function size limits (issue 27, part 5), in lines from `func` to the closing brace.
// Over longLines a function must be a table or a pure decision that reads better whole,
// and be listed in longFuncs; over maxLines none may be.
const (
	longLines = 100
	maxLines  = 150
)

// longFuncs are the non-test functions allowed over longLines, as "dir Func" or
// "dir Type.Method" (dir from the module root), each with why it is kept whole.
// docs/architecture.md lists them too.
var longFuncs = map[string]string{}

// TestFunctionSize keeps non-test, non-generated functions short: none over maxLines,
// and none over longLines that longFuncs does not list. An entry of longFuncs that is
// no longer over longLines fails too, so the list only names what it must.
func TestFunctionSize(t *testing.T) {
	fset := token.NewFileSet()
	var tooLong, unlisted []string
	over := map[string]bool{}
	walkModule(t, func(file, rel string) error {
		if strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start := fset.Position(fn.Pos()).Line
			n := fset.Position(fn.End()).Line - start + 1
			if n <= longLines {
				continue
			}
			key := path.Dir(rel) + " " + funcName(fn)
			where := fmt.Sprintf("%s:%d %s: %d lines (longFuncs key %q)", rel, start, funcName(fn), n, key)
			over[key] = true
			switch {
			case n > maxLines:
				tooLong = append(tooLong, where)
			case longFuncs[key] == "":
				unlisted = append(unlisted, where)
			}
		}
		return nil
	})
	if len(tooLong) > 0 {
		t.Errorf("these functions are over %d lines; split them into named steps:\n%s", maxLines, strings.Join(tooLong, "\n"))
	}
	if len(unlisted) > 0 {
		t.Errorf("these functions are over %d lines; split them, or, if one is a table or a pure decision that reads better whole, add it to longFuncs in %s with the reason (and to docs/architecture.md):\n%s",
			longLines, "internal/testreq/funcsize_test.go", strings.Join(unlisted, "\n"))
	}
	var stale []string
	for key := range longFuncs {
		if !over[key] {
			stale = append(stale, key)
		}
	}
	if len(stale) > 0 {
		slices.Sort(stale)
		t.Errorf("longFuncs lists functions no longer over %d lines (or gone); remove them:\n%s", longLines, strings.Join(stale, "\n"))
	}
}

// funcName is fn's name, with its receiver's type for a method: "Validate" or
// "Config.Validate".
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr: // a generic receiver, T[P]
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

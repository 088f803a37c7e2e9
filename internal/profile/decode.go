package profile

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a profile or lock file, located by file, line and field.
type Error struct {
	File  string
	Line  int    // 1-based; 0 when unknown
	Field string // dotted path, e.g. gpu.driver.flavor or packages[3].sha256
	Msg   string // what is wrong and what to fix
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

func (es Errors) sorted() Errors {
	sort.SliceStable(es, func(i, j int) bool { return es[i].Line < es[j].Line })
	return es
}

// positions maps a field path to the line where it appears in the source.
type positions map[string]int

// lineOf returns the line of path or of its nearest ancestor that appears in the file.
func (p positions) lineOf(path string) int {
	for path != "" {
		if l, ok := p[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return p[""]
}

// decoder walks a YAML node tree against a Go type, so that every unknown field, wrong
// type or duplicate key is reported with its line and dotted path, before anything is
// decoded. yaml.v3's own KnownFields reports Go type names rather than field paths.
type decoder struct {
	file string
	pos  positions
	errs Errors
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// decodeStrict parses data (YAML, or JSON, which is YAML) into out, which must be a
// pointer to a struct.
func decodeStrict(file string, data []byte, out any) (positions, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line := 0
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		msg = yamlLine.ReplaceAllString(msg, "")
		msg = strings.TrimLeft(msg, ": ")
		return nil, Errors{{File: file, Line: line, Msg: "not valid YAML: " + msg}}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, Errors{{File: file, Line: 1, Msg: "the file is empty"}}
	}
	d := &decoder{file: file, pos: positions{"": 1}}
	root := doc.Content[0]
	d.walk(root, reflect.TypeOf(out).Elem(), "")
	if len(d.errs) > 0 {
		return d.pos, d.errs.sorted()
	}
	if err := root.Decode(out); err != nil {
		// The walk accepts only what Decode can take; this is a bug, reported as such.
		return d.pos, Errors{{File: file, Line: root.Line, Msg: "internal decode error: " + err.Error()}}
	}
	return d.pos, nil
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Field: path, Msg: fmt.Sprintf(format, args...)})
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

var kindNames = map[yaml.Kind]string{
	yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list", yaml.ScalarNode: "a value",
	yaml.AliasNode: "an alias", yaml.DocumentNode: "a document",
}

func (d *decoder) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		d.fail(n, path, "YAML aliases are not supported; write the value out")
		return
	}
	if path != "" {
		if _, seen := d.pos[path]; !seen {
			d.pos[path] = n.Line
		}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // absent value: the field keeps its zero value and validation decides
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping of fields, found %s", kindNames[n.Kind])
			return
		}
		fields := map[string]reflect.StructField{}
		var names []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = f
			names = append(names, name)
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := k.Value
			f, ok := fields[key]
			fp := join(path, key)
			switch {
			case k.Kind != yaml.ScalarNode:
				d.fail(k, path, "a field name must be a plain word")
			case !ok:
				d.fail(k, fp, "unknown field %q%s; known fields here: %s", key, suggest(key, names), strings.Join(names, ", "))
			case seen[key]:
				d.fail(k, fp, "field %q is given twice; keep one", key)
			default:
				seen[key] = true
				d.pos[fp] = k.Line
				d.walk(v, f.Type, fp)
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping, found %s", kindNames[n.Kind])
			return
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			kp := path + "[" + k.Value + "]"
			if k.Kind != yaml.ScalarNode {
				d.fail(k, path, "a key must be a plain value")
				continue
			}
			if seen[k.Value] {
				d.fail(k, kp, "key %q is given twice; keep one", k.Value)
				continue
			}
			seen[k.Value] = true
			d.pos[kp] = k.Line
			d.walk(v, t.Elem(), kp)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "expected a list, found %s", kindNames[n.Kind])
			return
		}
		for i, item := range n.Content {
			d.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected %s, found %s", scalarName(t.Kind()), kindNames[n.Kind])
			return
		}
		if t.Kind() == reflect.String && n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" {
			// yaml.v3 would turn `yes` or `~` into text silently; insist on quoting.
			if n.Tag == "!!bool" {
				d.fail(n, path, "expected text, found the boolean %s; quote it", n.Value)
				return
			}
		}
		v := reflect.New(t)
		if err := n.Decode(v.Interface()); err != nil {
			d.fail(n, path, "expected %s, found %q", scalarName(t.Kind()), n.Value)
		}
	}
}

func scalarName(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "text"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return k.String()
}

// suggest names the known field closest to a misspelt one.
func suggest(key string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(strings.ToLower(key), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Package strictyaml decodes a YAML file (or a JSON one: JSON is YAML) into a Go struct
// strictly, and says where every problem is: each is reported as
// `FILE:LINE: FIELD: what to fix`, and all of them at once.
//
// It parses into a yaml.Node tree and walks it against the Go type (by the `yaml` struct
// tags) before decoding: an unknown field (with a did-you-mean), a value of the wrong
// type, a key given twice, an alias or a second document is an error. The walk records
// the line of every field, so that a caller's semantic validation can locate its own
// errors with Positions.Line. See docs/decisions/0002.
//
// It is the one decoder for gpurack's operator-written files: profiles and lock files
// (internal/profile), cluster.yaml (controlplane-bootstrap/clusterconfig) and
// gpuboot.yaml (pxe/config). It knows no schema and validates no values; that is each
// of those packages' job.
package strictyaml

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a file, located by file, line and field.
type Error struct {
	File  string
	Line  int    // 1-based; 0 when unknown
	Field string // dotted path, e.g. gpu.driver.flavor, packages[3].sha256 or node.labels[key]
	Msg   string // what is wrong and what to fix
	err   error  // ErrEmpty for an empty file
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

// Unwrap returns ErrEmpty for the error about an empty file, or nil.
func (e *Error) Unwrap() error { return e.err }

// Errors is every problem found in one file, one per line of its message.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.Is(err, ErrEmpty) see through Errors.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Sorted orders es by line, keeping the order of problems on the same line, and returns
// it.
func (es Errors) Sorted() Errors {
	sort.SliceStable(es, func(i, j int) bool { return es[i].Line < es[j].Line })
	return es
}

// ErrEmpty is what Decode reports (inside Errors, as "FILE:1: the file is empty") for
// a file with no document, or a document that is only null. A caller for whom an empty
// file means "all defaults" checks errors.Is(err, ErrEmpty).
var ErrEmpty = errors.New("the file is empty")

// Positions maps a field path, as Error.Field writes it, to the line where it appears.
// The root is "".
type Positions map[string]int

// Line returns the line of field or of its nearest ancestor that appears in the file,
// so that a missing field is reported where its parent is; 0 when none does.
func (p Positions) Line(field string) int {
	for field != "" {
		if l, ok := p[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return p[""]
}

// At is the Error for field in file, located by p. It is how callers report the
// problems their own validation finds.
func (p Positions) At(file, field, msg string) *Error {
	return &Error{File: file, Line: p.Line(field), Field: field, Msg: msg}
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// Decode parses data, which holds one YAML document, into out, a pointer to a struct,
// after checking it against out's type. file names the source in errors. The error is
// of type Errors. The Positions are returned also when the only problems are ones the
// walk found, and are nil for a file that is not valid YAML or is empty.
func Decode(file string, data []byte, out any) (Positions, error) {
	t := reflect.TypeOf(out)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("strictyaml.Decode: out is %T, want a pointer to a struct", out))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, empty(file)
		}
		return nil, syntaxError(file, err)
	}
	if len(doc.Content) == 0 || (doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null") {
		return nil, empty(file)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, Errors{{File: file, Line: max(extra.Line, 1), Msg: "holds more than one YAML document; keep one per file"}}
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(file, err)
	}
	root := doc.Content[0]
	w := &walker{file: file, pos: Positions{"": root.Line}}
	w.walk(root, t.Elem(), "")
	if len(w.errs) > 0 {
		return w.pos, w.errs.Sorted()
	}
	if err := root.Decode(out); err != nil {
		// The walk accepts only what Decode can take; this is a bug, reported as such.
		return w.pos, Errors{{File: file, Line: root.Line, Msg: "internal decode error: " + err.Error()}}
	}
	return w.pos, nil
}

func empty(file string) Errors {
	return Errors{{File: file, Line: 1, Msg: ErrEmpty.Error(), err: ErrEmpty}}
}

// syntaxError turns yaml.v3's "yaml: line 3: mapping values are not allowed in this
// context" into a located Error.
func syntaxError(file string, err error) Errors {
	line := 0
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = yamlLine.ReplaceAllString(msg, "")
	msg = strings.TrimLeft(msg, ": ")
	return Errors{{File: file, Line: line, Msg: "not valid YAML: " + msg}}
}

// walker checks a node tree against a Go type and records where every field is.
type walker struct {
	file string
	pos  Positions
	errs Errors
}

func (w *walker) fail(n *yaml.Node, path, format string, args ...any) {
	w.errs = append(w.errs, &Error{File: w.file, Line: n.Line, Field: path, Msg: fmt.Sprintf(format, args...)})
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

var (
	durationType    = reflect.TypeFor[time.Duration]()
	yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodesItself reports whether yaml.v3 hands t's values to t's own method, so the walk
// must not look inside them.
func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return p.Implements(yamlUnmarshaler) || p.Implements(textUnmarshaler)
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode {
		w.fail(n, path, "YAML aliases are not supported; write the value out")
		return
	}
	if path != "" {
		if _, seen := w.pos[path]; !seen {
			w.pos[path] = n.Line
		}
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // absent value: the field keeps its zero value and validation decides
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if decodesItself(t) {
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			w.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		w.walkStruct(n, t, path)
	case reflect.Map:
		w.walkMap(n, t, path)
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "expected a list, found %s", kindNames[n.Kind])
			return
		}
		if t.Kind() == reflect.Array && len(n.Content) != t.Len() {
			w.fail(n, path, "expected a list of %d, found %d", t.Len(), len(n.Content))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Interface:
		// Anything goes; the schema says no more.
	default:
		w.walkScalar(n, t, path)
	}
}

// walkStruct checks a mapping against the struct type t: known fields, each once.
func (w *walker) walkStruct(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "expected a mapping of fields, found %s", kindNames[n.Kind])
		return
	}
	fields := structFields(t)
	byName := make(map[string]reflect.Type, len(fields))
	names := make([]string, len(fields))
	for i, f := range fields {
		byName[f.name] = f.typ
		names[i] = f.name
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		ft, ok := byName[key]
		fp := join(path, key)
		switch {
		case k.Kind != yaml.ScalarNode:
			w.fail(k, path, "a field name must be a plain word, found %s", kindNames[k.Kind])
		case !ok:
			w.fail(k, fp, "unknown field %q%s; known fields here: %s", key, Suggest(key, names), strings.Join(names, ", "))
		case seen[key]:
			w.fail(k, fp, "field %q is given twice; keep one", key)
		default:
			seen[key] = true
			w.pos[fp] = k.Line
			w.walk(v, ft, fp)
		}
	}
}

// walkMap checks a mapping against the map type t: plain keys of its key type, each
// once.
func (w *walker) walkMap(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "expected a mapping, found %s", kindNames[n.Kind])
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			w.fail(k, path, "a key must be a plain value, found %s", kindNames[k.Kind])
			continue
		}
		kp := path + "[" + k.Value + "]"
		if seen[k.Value] {
			w.fail(k, kp, "key %q is given twice; keep one", k.Value)
			continue
		}
		seen[k.Value] = true
		if err := k.Decode(reflect.New(t.Key()).Interface()); err != nil {
			w.fail(k, kp, "expected %s as the key, found %q", scalarName(t.Key()), k.Value)
			continue
		}
		w.pos[kp] = k.Line
		w.walk(v, t.Elem(), kp)
	}
}

// walkScalar checks a value against the scalar type t, refusing what yaml.v3 would
// convert silently.
func (w *walker) walkScalar(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		w.fail(n, path, "expected %s, found %s", scalarName(t), kindNames[n.Kind])
		return
	}
	if t.Kind() == reflect.String && n.Tag == "!!bool" {
		// yaml.v3 would turn true into the text "true" silently; insist on quoting.
		w.fail(n, path, "expected text, found the boolean %s; quote it", n.Value)
		return
	}
	if wholeNumber(t) && n.Tag == "!!float" {
		// yaml.v3 would truncate 2.5 to 2 silently.
		w.fail(n, path, "expected %s, found %q", scalarName(t), n.Value)
		return
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		w.fail(n, path, "expected %s, found %q", scalarName(t), n.Value)
	}
}

// field is one YAML key of a struct and the type of its value.
type field struct {
	name string
	typ  reflect.Type
}

// structFields lists t's YAML keys in declaration order, as yaml.v3 names them: the
// tag's name, or the lowercased Go name without one; "-" and unexported fields are
// left out, and ",inline" structs contribute their own fields.
func structFields(t reflect.Type) []field {
	var fs []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				fs = append(fs, structFields(ft)...)
				continue
			}
			panic(fmt.Sprintf("strictyaml: inline %s in %s is not a struct; only inline structs are supported", f.Name, t))
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fs = append(fs, field{name: name, typ: f.Type})
	}
	return fs
}

func scalarName(t reflect.Type) string {
	if t == durationType {
		return "a duration such as 30s or 5m"
	}
	if wholeNumber(t) {
		return "a whole number"
	}
	switch t.Kind() {
	case reflect.String:
		return "text"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a " + t.String()
}

// wholeNumber reports whether t is an integer type.
func wholeNumber(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// Suggest names the choice closest to a misspelt word (case aside, at most two edits
// away) as ` (did you mean "choice"?)`, or returns "" when none is that close.
func Suggest(word string, choices []string) string {
	best, bestD := "", 3
	for _, c := range choices {
		if d := editDistance(strings.ToLower(word), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
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

package clusterconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is every problem found in one cluster.yaml, one per line of its
// message, each as "FILE:LINE: FIELD: what is wrong and what to write".
type Error struct {
	File     string
	Problems []Problem
}

// Problem is one invalid or unknown field.
type Problem struct {
	Line  int // 1-based; 0 when the field is absent from the file
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
		if p.Field != "" {
			b.WriteString(p.Field + ": ")
		}
		b.WriteString(p.Msg)
	}
	return b.String()
}

// Load reads and parses the file at path; see Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes cluster.yaml strictly (unknown fields and wrong types are
// errors), applies the defaults and validates the result. name is used in
// error messages. An empty document yields the defaults.
func Parse(name string, data []byte) (*Config, error) {
	cfg := &Config{}
	lines := map[string]int{}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, &Error{File: name, Problems: []Problem{{Line: yamlErrLine(err), Msg: "not valid YAML: " + err.Error()}}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{File: name, Problems: []Problem{{Line: extra.Line, Msg: "holds more than one YAML document; keep one ClusterConfig per file"}}}
	}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		doc := root.Content[0]
		var problems []Problem
		walk(doc, reflect.TypeOf(Config{}), "", lines, &problems)
		if len(problems) > 0 {
			return nil, &Error{File: name, Problems: problems}
		}
		if err := doc.Decode(cfg); err != nil {
			return nil, &Error{File: name, Problems: []Problem{{Line: yamlErrLine(err), Msg: err.Error()}}}
		}
	}
	cfg.applyDefaults()
	if fes := cfg.Validate(); len(fes) > 0 {
		e := &Error{File: name}
		for _, fe := range fes {
			e.Problems = append(e.Problems, Problem{Line: lineOf(lines, fe.Field), Field: fe.Field, Msg: fe.Msg})
		}
		return nil, e
	}
	return cfg, nil
}

// walk checks node against type t: every mapping key must be a known yaml
// field, and scalars must be of a kind the field accepts. It records the line
// of every field path it visits in lines.
func walk(node *yaml.Node, t reflect.Type, path string, lines map[string]int, problems *[]Problem) {
	if path != "" {
		lines[path] = node.Line
	}
	if node.Kind == yaml.AliasNode {
		*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: "YAML aliases are not supported here; write the value out"})
		return
	}
	if node.Kind == yaml.ScalarNode && node.Tag == "!!null" {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if node.Kind != yaml.MappingNode {
			*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: "must be a mapping of fields"})
			return
		}
		fields := map[string]reflect.StructField{}
		for i := range t.NumField() {
			f := t.Field(i)
			fields[strings.Split(f.Tag.Get("yaml"), ",")[0]] = f
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			f, ok := fields[k.Value]
			if !ok {
				*problems = append(*problems, Problem{Line: k.Line, Field: p, Msg: "unknown field" + suggest(k.Value, fields)})
				continue
			}
			if seen[k.Value] {
				*problems = append(*problems, Problem{Line: k.Line, Field: p, Msg: "appears twice"})
				continue
			}
			seen[k.Value] = true
			walk(v, f.Type, p, lines, problems)
		}
	case reflect.Map:
		if node.Kind != yaml.MappingNode {
			*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: "must be a mapping of flag names to values"})
			return
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			k, v := node.Content[i], node.Content[i+1]
			p := path + "." + k.Value
			lines[p] = k.Line
			if v.Kind != yaml.ScalarNode {
				*problems = append(*problems, Problem{Line: v.Line, Field: p, Msg: "must be a single value (quote it if it is a list for the flag)"})
			}
		}
	case reflect.Slice:
		if node.Kind != yaml.SequenceNode {
			*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: "must be a list"})
			return
		}
		for i, item := range node.Content {
			walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), lines, problems)
		}
	case reflect.String:
		if node.Kind != yaml.ScalarNode {
			*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: "must be a single value, not a list or mapping"})
		}
	case reflect.Int:
		if node.Kind != yaml.ScalarNode || node.Tag != "!!int" {
			*problems = append(*problems, Problem{Line: node.Line, Field: path, Msg: fmt.Sprintf("%q is not a whole number", node.Value)})
		}
	}
}

// suggest names a known field that differs from key only in case, the most
// common typo (apiserver for apiServer).
func suggest(key string, fields map[string]reflect.StructField) string {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Sprintf(" (did you mean %q?)", name)
		}
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	return "; known fields here: " + strings.Join(names, ", ")
}

// lineOf returns the line of field, or of its nearest ancestor in the file.
func lineOf(lines map[string]int, field string) int {
	for field != "" {
		if l, ok := lines[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// yamlErrLine extracts "line N" from a yaml.v3 error, or 0.
func yamlErrLine(err error) int {
	var n int
	msg := err.Error()
	if i := strings.Index(msg, "line "); i >= 0 {
		fmt.Sscanf(msg[i:], "line %d", &n)
	}
	return n
}

// Marshal renders c as cluster.yaml (every field, defaults included).
func (c *Config) Marshal() ([]byte, error) {
	return yaml.Marshal(c)
}

package strictyaml

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// rack is a schema with one of each kind of field the walker handles.
type rack struct {
	Name     string            `yaml:"name"`
	Slots    int               `yaml:"slots"`
	Enabled  *bool             `yaml:"enabled"`
	Ratio    float64           `yaml:"ratio,omitempty"`
	Interval time.Duration     `yaml:"interval"`
	Gateway  netip.Addr        `yaml:"gateway"`
	Labels   map[string]string `yaml:"labels"`
	Hosts    []host            `yaml:"hosts"`
	Owner    `yaml:",inline"`
	Notag    string
	Skipped  string `yaml:"-"`
	hidden   string // an unexported field is not a YAML key
}

type host struct {
	MAC  string   `yaml:"mac"`
	Tags []string `yaml:"tags"`
}

type Owner struct {
	Team string `yaml:"team"`
}

const good = `name: r1
slots: 42
enabled: true
ratio: 0.5
interval: 30s
gateway: 192.0.2.1
labels:
  zone: a
hosts:
  - mac: 52:54:00:00:00:01
    tags: [gpu]
team: infra
notag: x
`

func TestDecodeGood(t *testing.T) {
	var r rack
	pos, err := Decode("r.yaml", []byte(good), &r)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "r1" || r.Slots != 42 || !*r.Enabled || r.Interval != 30*time.Second || r.Gateway.String() != "192.0.2.1" ||
		r.Labels["zone"] != "a" || r.Hosts[0].Tags[0] != "gpu" || r.Team != "infra" || r.Notag != "x" || r.hidden != "" {
		t.Fatalf("decoded %+v", r)
	}
	for field, line := range map[string]int{
		"":                  1,
		"name":              1,
		"interval":          5,
		"labels[zone]":      8,
		"hosts[0].mac":      10,
		"hosts[0].tags[0]":  11,
		"hosts[0].tags[7]":  11, // absent: its parent's line
		"hosts[0].serial":   10,
		"team":              12,
		"missing.deep.path": 1,
	} {
		if got := pos.Line(field); got != line {
			t.Errorf("Line(%q) = %d, want %d", field, got, line)
		}
	}
	if e := pos.At("r.yaml", "labels[zone]", "bad zone"); e.Error() != "r.yaml:8: labels[zone]: bad zone" {
		t.Errorf("At: %q", e)
	}
}

// Every problem is reported at once, in line order, each as FILE:LINE: FIELD: message.
func TestDecodeReportsEveryProblem(t *testing.T) {
	src := `nmae: r1
slots: many
enabled: maybe
interval: soon
gateway: not-an-ip
labels: [a]
hosts:
  - mac: true
    tags: {x: 1}
  - {}
slots: 3
team: [a]
`
	want := []string{
		`r.yaml:1: nmae: unknown field "nmae" (did you mean "name"?); known fields here: name, slots, enabled, ratio, interval, gateway, labels, hosts, team, notag`,
		`r.yaml:2: slots: expected a whole number, found "many"`,
		`r.yaml:3: enabled: expected true or false, found "maybe"`,
		`r.yaml:4: interval: expected a duration such as 30s or 5m, found "soon"`,
		`r.yaml:5: gateway: `,
		`r.yaml:6: labels: expected a mapping, found a list`,
		`r.yaml:8: hosts[0].mac: expected text, found the boolean true; quote it`,
		`r.yaml:9: hosts[0].tags: expected a list, found a mapping`,
		`r.yaml:11: slots: field "slots" is given twice; keep one`,
		`r.yaml:12: team: expected text, found a list`,
	}
	var r rack
	_, err := Decode("r.yaml", []byte(src), &r)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("want Errors, got %v", err)
	}
	if len(es) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(es[i].Error(), w) {
			t.Errorf("problem %d:\n got %s\nwant %s", i, es[i], w)
		}
	}
}

func TestDecodeShapes(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"alias", "name: &n r1\nteam: *n\n", "r.yaml:2: team: YAML aliases are not supported"},
		{"duplicate map key", "labels:\n  a: x\n  a: y\n", `r.yaml:3: labels[a]: key "a" is given twice`},
		{"not a mapping", "just text\n", "r.yaml:1: expected a mapping of fields, found a value"},
		{"list root", "- a\n", "r.yaml:1: expected a mapping of fields, found a list"},
		// yaml.v3 places some syntax errors a line early; the line is its own.
		{"syntax", "name: r1\nlabels: [unclosed\n", "r.yaml:1: not valid YAML: did not find expected"},
		{"tab", "name: r1\n\tslots: 1\n", "r.yaml:2: not valid YAML: "},
		{"two documents", "name: a\n---\nname: b\n", "r.yaml:2: holds more than one YAML document"},
		{"bad second document", "name: a\n---\nname: [\n", "r.yaml:3: not valid YAML"},
		{"unexported field", "hidden: x\n", `r.yaml:1: hidden: unknown field "hidden"`},
		{"yaml:\"-\" field", "skipped: x\n", `r.yaml:1: skipped: unknown field "skipped"`},
		{"complex key", "? [a]\n: 1\n", "r.yaml:1: a field name must be a plain word"},
		{"fraction for a whole number", "slots: 2.5\n", `r.yaml:1: slots: expected a whole number, found "2.5"`},
		{"float for a whole number", "slots: 1e1\n", `r.yaml:1: slots: expected a whole number, found "1e1"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r rack
			_, err := Decode("r.yaml", []byte(c.src), &r)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("got %v\nwant it to start with %q", err, c.want)
			}
		})
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, src := range []string{"", "\n\n", "# only a comment\n", "---\n", "~\n", "null\n"} {
		var r rack
		_, err := Decode("r.yaml", []byte(src), &r)
		if !errors.Is(err, ErrEmpty) || err.Error() != "r.yaml:1: the file is empty" {
			t.Errorf("%q: got %v, want ErrEmpty located at line 1", src, err)
		}
	}
	var r rack
	if _, err := Decode("r.yaml", []byte("name: x\nslots: x\n"), &r); errors.Is(err, ErrEmpty) {
		t.Errorf("a non-empty file reported as empty: %v", err)
	}
}

// JSON is YAML: lock files go through the same walker and get lines too.
func TestDecodeJSON(t *testing.T) {
	var r rack
	_, err := Decode("r.json", []byte("{\n  \"name\": \"r1\",\n  \"slots\": \"x\"\n}\n"), &r)
	if err == nil || err.Error() != `r.json:3: slots: expected a whole number, found "x"` {
		t.Fatalf("got %v", err)
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"apiServer", "etcd", "networking"}
	for word, want := range map[string]string{
		"apiserver":   ` (did you mean "apiServer"?)`,
		"etdc":        ` (did you mean "etcd"?)`,
		"networkin":   ` (did you mean "networking"?)`,
		"colour":      "",
		"":            "",
		"netwrkingxx": "",
	} {
		if got := Suggest(word, names); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", word, got, want)
		}
	}
}

func TestDecodeRejectsNonStruct(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Decode into a map did not panic")
		}
	}()
	var m map[string]string
	Decode("x.yaml", []byte("a: b\n"), &m)
}

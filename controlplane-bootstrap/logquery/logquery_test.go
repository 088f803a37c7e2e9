package logquery

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

func TestLogsQL(t *testing.T) {
	f := Filter{Node: "gpu-1", Unit: "kubelet.service", Identifier: "gpurack-break-glass", Boot: "01234567-89AB-cdef-0123-456789abcdef", Extra: "error OR xid"}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	want := `node:="gpu-1" AND unit:="kubelet.service" AND identifier:="gpurack-break-glass" AND boot_id:="0123456789abcdef0123456789abcdef" AND (error OR xid)`
	if got := f.LogsQL(); got != want {
		t.Errorf("LogsQL = %s, want %s", got, want)
	}
	if got := (Filter{}).LogsQL(); got != "*" {
		t.Errorf("empty filter: %s", got)
	}
	if got := BootsQuery(Filter{Node: "n"}); !strings.HasPrefix(got, `node:="n" | stats by (node, boot_id) min(_time) as first`) {
		t.Errorf("BootsQuery = %s", got)
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		f    Filter
		want string
	}{
		{Filter{Node: "GPU 1"}, "--node"},
		{Filter{Unit: `a" OR *`}, "--unit"},
		{Filter{Identifier: "a b"}, "--identifier"},
		{Filter{Namespace: "a.b"}, "--namespace"},
		{Filter{Pod: "-x"}, "--pod"},
		{Filter{Container: "A"}, "--container"},
		{Filter{Boot: "xyz"}, "--boot"},
		{Filter{Source: "kernel"}, "--source"},
		{Filter{Extra: strings.Repeat("a", 5000)}, "--query"},
	} {
		if err := tc.f.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.want)
		}
	}
}

// FuzzFilterQuoting: a value that passes Validate appears in the query only as one
// quoted literal that reads back as the value, so no flag but --query changes the
// query's structure.
func FuzzFilterQuoting(f *testing.F) {
	for _, s := range []string{"gpu-1", "kubelet.service", `x" OR node:*`, "a\\b", "systemd-journald@1.service", "a\nb", "é"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, node, unit string) {
		flt := Filter{Node: node, Unit: unit}
		if flt.Validate() != nil {
			return
		}
		q := flt.LogsQL()
		if node == "" && unit == "" {
			if q != "*" {
				t.Fatalf("no filter: %s", q)
			}
			return
		}
		rest := q
		for _, fv := range []struct{ field, v string }{{"node", node}, {"unit", unit}} {
			if fv.v == "" {
				continue
			}
			prefix := fv.field + ":="
			i := strings.Index(rest, prefix)
			if i < 0 {
				t.Fatalf("%s missing from %s", prefix, q)
			}
			lit, err := strconv.QuotedPrefix(rest[i+len(prefix):])
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if v, _ := strconv.Unquote(lit); v != fv.v {
				t.Fatalf("%s reads back as %q, not %q", lit, v, fv.v)
			}
			rest = rest[i+len(prefix)+len(lit):]
		}
		if strings.Count(q, " AND ") != strings.Count(q, ":=")-1 {
			t.Fatalf("the structure changed: %s", q)
		}
	})
}

func TestParseAndFormat(t *testing.T) {
	answer := `{"_time":"2026-12-04T22:00:01.5Z","_msg":"second","node":"gpu-1","source":"container","namespace":"ns","pod":"p","container":"c","truncated":"true"}
{"_time":"2026-12-04T22:00:00Z","_msg":"first\nline","node":"gpu-1","source":"journal","unit":"kubelet.service","lines":3}
`
	es, err := ParseEntries(strings.NewReader(answer))
	if err != nil || len(es) != 2 || es[1]["lines"] != "3" {
		t.Fatalf("ParseEntries: %v %v", es, err)
	}
	SortByTime(es)
	var b bytes.Buffer
	FormatText(&b, es)
	want := "2026-12-04T22:00:00.000Z gpu-1 kubelet.service first\\nline\n2026-12-04T22:00:01.500Z gpu-1 ns/p/c second [truncated]\n"
	if b.String() != want {
		t.Errorf("FormatText:\n%s\nwant\n%s", b.String(), want)
	}
	if _, err := ParseEntries(strings.NewReader("{not json}\n")); err == nil || !strings.Contains(err.Error(), "answer line 1") {
		t.Errorf("a bad answer line: %v", err)
	}
}

// FuzzParseEntries: any answer parses or fails without panicking, and what parses
// formats.
func FuzzParseEntries(f *testing.F) {
	f.Add(`{"_time":"2026-12-04T22:00:00Z","_msg":"m","node":"n"}` + "\n")
	f.Add(`{"a":1,"b":null,"c":[1]}`)
	f.Add("\n\n{")
	f.Fuzz(func(t *testing.T, s string) {
		es, _ := ParseEntries(strings.NewReader(s))
		SortByTime(es)
		var b bytes.Buffer
		if err := FormatText(&b, es); err != nil {
			t.Fatal(err)
		}
		if strings.Count(b.String(), "\n") != len(es) {
			t.Fatalf("%d entries printed as %q", len(es), b.String())
		}
	})
}

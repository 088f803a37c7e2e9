package graphs

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  Request
		err   string
	}{
		{"node=gpu-r1-u01", Request{KindNode, "gpu-r1-u01", Range{"1h", time.Hour}}, ""},
		{"node=gpu-0001.rack1.example&range=5m", Request{KindNode, "gpu-0001.rack1.example", Range{"5m", 5 * time.Minute}}, ""},
		{"tenant=vision&range=7d", Request{KindTenant, "vision", Range{"7d", 7 * 24 * time.Hour}}, ""},
		{"", Request{}, "say what to draw"},
		{"range=1h", Request{}, "say what to draw"},
		{"node=a&tenant=b", Request{}, "not both"},
		{"node=a&node=b", Request{}, "node is given 2 times"},
		{"node=a&range=1h&range=2h", Request{}, "range is given 2 times"},
		{"node=a&query=up", Request{}, `unknown parameter "query"`},
		{"node=Gpu-1", Request{}, "is not a node name"},
		{"node=gpu_1", Request{}, "is not a node name"},
		{"node=", Request{}, "is not a node name"},
		{"node=-a", Request{}, "is not a node name"},
		{"node=a..b", Request{}, "is not a node name"},
		{`node=a"}or{x="`, Request{}, "is not a node name"},
		{"node=" + strings.Repeat("a", 254), Request{}, "is not a node name"},
		{"tenant=a.b", Request{}, "is not a tenant name"},
		{"tenant=" + strings.Repeat("a", 64), Request{}, "is not a tenant name"},
		{"node=a&range=90m", Request{}, `range "90m": use one of 5m, 15m, 1h`},
		{"node=a&range=", Request{}, `range "": use one of`},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRequest(q)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, %v; want an error containing %q", tc.query, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.query, got, err, tc.want)
		}
	}
}

func TestStepBoundsPoints(t *testing.T) {
	for _, r := range Ranges {
		req := Request{KindNode, "n", r}
		s := req.Step()
		if s < time.Second || s%time.Second != 0 || r.Span/s > MaxPoints+1 && s > time.Second {
			t.Errorf("range %s: step %s", r.Text, s)
		}
		if n := int(r.Span/s) + 1; n > 2*MaxPoints {
			t.Errorf("range %s: %d points a line", r.Text, n)
		}
	}
	if q := (Request{KindTenant, "vision", Ranges[0]}).Query(); q != "range=5m&tenant=vision" {
		t.Errorf("Query() = %q", q)
	}
}

// FuzzParseRequest feeds arbitrary query strings to the parser: it never panics, an
// accepted request names a valid node or tenant and a listed range, its own query
// parses back to it, and a name can never close the PromQL string it is put in.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{"node=gpu-r1-u01&range=1h", "tenant=vision", "node=a&tenant=b", "node=%22%7D", "range=7d&node=x.y", "node=a&node=a", "x=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		r, err := ParseRequest(q)
		if err != nil {
			if len(err.Error()) > 1024 {
				t.Fatalf("error of %d bytes echoes too much: %q", len(err.Error()), err)
			}
			return
		}
		if r.Kind != KindNode && r.Kind != KindTenant || r.Name == "" || r.Range.Span == 0 {
			t.Fatalf("accepted %q as %+v", raw, r)
		}
		if strings.ContainsAny(r.Name, "\"\\{}()=~!,` \n") {
			t.Fatalf("accepted name %q", r.Name)
		}
		back, err := url.ParseQuery(r.Query())
		if err != nil {
			t.Fatal(err)
		}
		if again, err := ParseRequest(back); err != nil || again != r {
			t.Fatalf("%q round-trips to %+v, %v", r.Query(), again, err)
		}
		for _, c := range Charts(r) {
			if !strings.Contains(c.Query, label(r.Name)) {
				t.Fatalf("chart %s's query %q lacks the quoted name", c.ID, c.Query)
			}
		}
	})
}

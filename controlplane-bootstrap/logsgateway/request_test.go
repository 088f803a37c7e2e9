package logsgateway

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestCheckQuery(t *testing.T) {
	for _, tc := range []struct {
		raw, wantErr string
	}{
		{"", ""},
		{"_stream_fields=node,source,unit,namespace,pod,container&_time_field=_time&_msg_field=_msg", ""},
		{"_msg_field=_msg", ""},
		{"_stream_fields=node%2Csource%2Cunit%2Cnamespace%2Cpod%2Ccontainer", ""},
		{"extra_fields=node=other", `query argument "extra_fields" is not accepted`},
		{"_stream_fields=_msg", `_stream_fields="_msg": the gateway takes only`},
		{"_time_field=_time&_time_field=_time", `"_time_field" is given 2 times`},
		{"AccountID=1", `"AccountID" is not accepted`},
		{"debug=1", `"debug" is not accepted`},
		{"_msg_field=%zz", "query string"},
		{strings.Repeat("a", 2000), "query string of 2000 bytes"},
	} {
		err := CheckQuery(tc.raw)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckQuery(%q) = %v, want %q", tc.raw, err, tc.wantErr)
		}
	}
}

// FuzzCheckQuery: whatever a node sends, an accepted query holds only the contract's
// arguments with their values, once each.
func FuzzCheckQuery(f *testing.F) {
	for _, s := range []string{"", "_stream_fields=node,source,unit,namespace,pod,container&_time_field=_time&_msg_field=_msg",
		"extra_fields=node=x", "_msg_field=_msg&_msg_field=_msg", "a=%zz", "_time_field=_time;x=1", "_stream_fields=node%2Csource"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if CheckQuery(raw) != nil {
			return
		}
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatalf("accepted %q that does not parse: %v", raw, err)
		}
		for k, vs := range q {
			if want, ok := contractArgs[k]; !ok || len(vs) != 1 || vs[0] != want {
				t.Fatalf("accepted %q: %s=%q", raw, k, vs)
			}
		}
	})
}

func nodeCert(cn string, orgs ...string) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn, Organization: orgs}}
}

func TestNodeName(t *testing.T) {
	for _, tc := range []struct {
		cert *x509.Certificate
		want string
	}{
		{nodeCert("system:node:gpu-r1-u01", "system:nodes"), "gpu-r1-u01"},
		{nodeCert("system:node:gpu.rack-1", "other", "system:nodes"), "gpu.rack-1"},
		{nodeCert("system:node:gpu-1"), ""},
		{nodeCert("system:node:", "system:nodes"), ""},
		{nodeCert("system:node:GPU_1", "system:nodes"), ""},
		{nodeCert("gpurack:monitoring", "system:nodes"), ""},
		{nodeCert("system:node:"+strings.Repeat("a", 254), "system:nodes"), ""},
		{nil, ""},
	} {
		got, err := NodeName(tc.cert)
		if got != tc.want || (tc.want == "") != errors.Is(err, ErrNotANode) {
			t.Errorf("NodeName(%v) = %q, %v; want %q", tc.cert, got, err, tc.want)
		}
	}
}

// FuzzNodeName: an accepted subject is exactly system:node:NAME with system:nodes,
// and NAME is what goes into the node field.
func FuzzNodeName(f *testing.F) {
	f.Add("system:node:gpu-1", "system:nodes")
	f.Add("system:node:a.b", "x")
	f.Add("system:node:a\x00b", "system:nodes")
	f.Fuzz(func(t *testing.T, cn, org string) {
		name, err := NodeName(nodeCert(cn, org))
		if err != nil {
			return
		}
		if cn != NodeUserPrefix+name || org != NodesGroup || strings.ContainsAny(name, ",=\" \x00") || !dnsSubdomain.MatchString(name) {
			t.Fatalf("accepted CN %q O %q as node %q", cn, org, name)
		}
	})
}

func TestUpstreamURL(t *testing.T) {
	got := UpstreamURL("http://127.0.0.1:9429/", "gpu-1")
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Path != InsertPath || q.Get("extra_fields") != "node=gpu-1" || q.Get("_stream_fields") != StreamFields || q.Get("_time_field") != "_time" || q.Get("_msg_field") != "_msg" || len(q) != 4 {
		t.Errorf("UpstreamURL = %s", got)
	}
}

func TestCheckEncoding(t *testing.T) {
	for enc, want := range map[string]bool{"": false, "identity": false, "gzip": true, "GZIP": true} {
		if gz, err := CheckEncoding(enc); err != nil || gz != want {
			t.Errorf("CheckEncoding(%q) = %v, %v", enc, gz, err)
		}
	}
	for _, enc := range []string{"zstd", "br", "gzip, deflate"} {
		if _, err := CheckEncoding(enc); err == nil {
			t.Errorf("CheckEncoding(%q) accepted", enc)
		}
	}
}

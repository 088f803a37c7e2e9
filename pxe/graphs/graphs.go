// Package graphs is gpuboot's graphs page: per-GPU utilisation, memory, temperature
// and power over time, for one node or for one tenant, drawn in the operator's browser
// from the metrics server's range queries (decision 0692: Prometheus is built without
// its web UI, so gpuboot serves the page). The page is one self-contained HTML file
// (inline CSS, inline JavaScript that draws SVG, nothing fetched but its own data);
// its data comes from a same-origin JSON endpoint that runs a fixed set of named
// queries (Charts) built here from validated names, never PromQL a browser sends.
//
// It authenticates no one: pxe/admin serves Page and Data behind its operator check.
package graphs

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"time"
)

// DataPath is where the page fetches its data from; pxe/admin routes it.
const DataPath = "/api/v1/graphs"

// Source runs range queries; *Prometheus is the one gpuboot uses.
type Source interface {
	QueryRange(ctx context.Context, query string, start, end time.Time, step time.Duration) ([]Series, bool, error)
	String() string
}

// Config configures Graphs.
type Config struct {
	// PrometheusURL is the metrics server's base URL (gpuboot.yaml
	// metrics.prometheusURL); empty: the page says it is not configured.
	PrometheusURL string
	// Source replaces the Prometheus at PrometheusURL (tests).
	Source Source
	// KnownNode says whether gpuboot manages a machine with node name name; nil: any
	// valid name is drawn.
	KnownNode func(ctx context.Context, name string) (bool, error)
	// Operator names the signed-in operator of a request, for the page's header.
	Operator func(*http.Request) string
}

// Graphs serves the page and its data.
type Graphs struct {
	src       Source // nil: not configured
	knownNode func(context.Context, string) (bool, error)
	operator  func(*http.Request) string
	now       func() time.Time
}

// New returns Graphs over cfg.
func New(cfg Config) (*Graphs, error) {
	g := &Graphs{src: cfg.Source, knownNode: cfg.KnownNode, operator: cfg.Operator, now: time.Now}
	if g.src == nil && cfg.PrometheusURL != "" {
		p, err := NewPrometheus(cfg.PrometheusURL)
		if err != nil {
			return nil, err
		}
		g.src = p
	}
	return g, nil
}

// notConfigured is what page and data say without a metrics server.
const notConfigured = "The metrics server is not configured: set metrics.prometheusURL in gpuboot.yaml to its base URL " +
	"(e.g. http://127.0.0.1:9090, the Prometheus controlplane-bootstrap init starts with monitoring.enabled) and restart gpuboot serve."

// check parses q and says whether its node or tenant is known. The error comes with
// the HTTP status to answer: 400 for a request to correct. A metrics server that
// cannot say whether a tenant exists does not stop the request: its data will say why.
func (g *Graphs) check(ctx context.Context, q map[string][]string) (Request, int, error) {
	req, err := ParseRequest(q)
	if err != nil {
		return Request{}, http.StatusBadRequest, err
	}
	switch {
	case req.Kind == KindNode && g.knownNode != nil:
		ok, err := g.knownNode(ctx, req.Name)
		if err != nil {
			return Request{}, http.StatusInternalServerError, fmt.Errorf("looking up node %q: %w", req.Name, err)
		}
		if !ok {
			return Request{}, http.StatusBadRequest, fmt.Errorf("unknown node %q: gpuboot manages no machine with that node name (the rack views list them)", req.Name)
		}
	case req.Kind == KindTenant && g.src != nil:
		end := g.now()
		s, _, err := g.src.QueryRange(ctx, TenantKnown(req.Name, req.Range.Span), end, end, time.Second)
		if err == nil && len(s) == 0 {
			return Request{}, http.StatusBadRequest, fmt.Errorf("unknown tenant %q: the metrics server has no gpurack_tenant_namespace series naming it in the last %s "+
				"(controlplane-bootstrap tenants status --textfile exports them)", req.Name, req.Range.Text)
		}
	}
	return req, http.StatusOK, nil
}

//go:embed page.html
var pageHTML string

//go:embed page.js
var pageJS string

//go:embed page.css
var pageCSS string

var pageTemplate = template.Must(template.New("graphs").Parse(pageHTML))

// ContentSecurityPolicy lets the page run its own script and stylesheet (by hash) and
// fetch from its own origin, and nothing else.
var ContentSecurityPolicy = fmt.Sprintf("default-src 'none'; script-src '%s'; style-src '%s'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	hash(pageJS), hash(pageCSS))

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

type rangeLink struct {
	Text, Href string
	Current    bool
}

// Page serves GET /graphs?node=NAME|tenant=NAME[&range=R]: the page, which fetches
// its data from DataPath with the same parameters. A request to correct is 400 with
// what to correct; without a metrics server, 503 and a page that says so.
func (g *Graphs) Page(w http.ResponseWriter, r *http.Request) {
	req, code, err := g.check(r.Context(), r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	d := map[string]any{"Kind": string(req.Kind), "Name": req.Name, "Range": req.Range.Text,
		"Style": template.CSS(pageCSS), "Script": template.JS(pageJS)}
	if g.operator != nil {
		d["Operator"] = g.operator(r)
	}
	var links []rangeLink
	for _, rg := range Ranges {
		links = append(links, rangeLink{Text: rg.Text, Href: "/graphs?" + Request{Kind: req.Kind, Name: req.Name, Range: rg}.Query(), Current: rg == req.Range})
	}
	d["Ranges"] = links
	if req.Kind == KindNode {
		d["What"] = "The GPUs of node " + req.Name + ": utilisation, memory used, temperature and power draw, one line per GPU (gpuagent's series with the scrape's node label)."
	} else {
		d["What"] = "The GPUs tenant " + req.Name + "'s containers hold, on any node, while they hold them (gpurack_gpu_allocated joined with gpurack_tenant_namespace), " +
			"one line per GPU, and the GPUs it holds per host. A time-sliced GPU it shares is in the other tenant's graphs too."
	}
	if g.src == nil {
		d["NotConfigured"] = notConfigured
		code = http.StatusServiceUnavailable
	} else {
		d["API"] = DataPath + "?" + req.Query()
		d["Source"] = g.src.String()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", ContentSecurityPolicy)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	pageTemplate.Execute(w, d)
}

// writeJSON answers v as JSON with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// errorAnswer is the JSON of a refused or failed data request.
type errorAnswer struct {
	Error string `json:"error"`
}

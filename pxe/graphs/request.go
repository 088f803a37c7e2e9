package graphs

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Kind is what a graphs page is about.
type Kind string

const (
	// KindNode: the GPUs of one node (the scrape's node label).
	KindNode Kind = "node"
	// KindTenant: the GPUs a tenant's containers hold, on every node.
	KindTenant Kind = "tenant"
)

// Range is one of the time spans a page may show; Text is how the query parameter and
// the page write it.
type Range struct {
	Text string
	Span time.Duration
}

// Ranges are the spans a page may show, shortest first. A fixed list: a caller cannot
// ask the metrics server for a range or step of its own choosing.
var Ranges = []Range{
	{"5m", 5 * time.Minute}, {"15m", 15 * time.Minute}, {"1h", time.Hour}, {"3h", 3 * time.Hour},
	{"6h", 6 * time.Hour}, {"12h", 12 * time.Hour}, {"24h", 24 * time.Hour}, {"2d", 48 * time.Hour}, {"7d", 7 * 24 * time.Hour},
}

// DefaultRange is the span of a page that names none.
const DefaultRange = "1h"

// MaxPoints is the most points a line has: the step is the range divided by it (at
// least a second), so the metrics server is never asked for more.
const MaxPoints = 300

// Request is a validated graphs request: a node or a tenant, and a range.
type Request struct {
	Kind  Kind
	Name  string
	Range Range
}

// Step is the resolution of the range queries: Range/MaxPoints, at least a second,
// in whole seconds.
func (r Request) Step() time.Duration {
	s := (r.Range.Span / MaxPoints).Truncate(time.Second)
	return max(s, time.Second)
}

// Query is r as the query string of its page and of its data.
func (r Request) Query() string {
	return url.Values{string(r.Kind): {r.Name}, "range": {r.Range.Text}}.Encode()
}

// nodeName is a Kubernetes node name: a DNS subdomain (RFC 1123 labels joined by
// dots), lowercase, at most 253 characters. tenantName is a tenant's name as
// tenants.yaml allows it: one DNS label, at most 63.
var (
	nodeName   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	tenantName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// ParseRequest reads a graphs page's or its data's query parameters: exactly one of
// node=NAME or tenant=NAME, and optionally range= (one of Ranges; DefaultRange when
// absent). Anything else, or a parameter given twice, is an error that says what to
// send instead. It decides nothing about whether the node or tenant exists.
func ParseRequest(q url.Values) (Request, error) {
	var unknown []string
	for k, vs := range q {
		switch {
		case k != "node" && k != "tenant" && k != "range":
			unknown = append(unknown, k)
		case len(vs) > 1:
			return Request{}, fmt.Errorf("%s is given %d times; give it once", k, len(vs))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return Request{}, fmt.Errorf("unknown parameter %s; a graphs page takes node=NAME or tenant=NAME, and range=%s", quoteAll(unknown), rangeTexts())
	}
	node, hasNode := q["node"]
	tenant, hasTenant := q["tenant"]
	var r Request
	switch {
	case hasNode && hasTenant:
		return Request{}, fmt.Errorf("give node=NAME or tenant=NAME, not both")
	case hasNode:
		r.Kind, r.Name = KindNode, node[0]
		if len(r.Name) > 253 || !nodeName.MatchString(r.Name) {
			return Request{}, fmt.Errorf("node %q is not a node name (lowercase letters, digits, '-' and '.', at most 253 characters)", clip(r.Name))
		}
	case hasTenant:
		r.Kind, r.Name = KindTenant, tenant[0]
		if len(r.Name) > 63 || !tenantName.MatchString(r.Name) {
			return Request{}, fmt.Errorf("tenant %q is not a tenant name (a DNS label: lowercase letters, digits and '-', at most 63 characters)", clip(r.Name))
		}
	default:
		return Request{}, fmt.Errorf("say what to draw: node=NAME (a node's GPUs) or tenant=NAME (the GPUs a tenant holds)")
	}
	text := DefaultRange
	if v, ok := q["range"]; ok {
		text = v[0]
	}
	i := slices.IndexFunc(Ranges, func(g Range) bool { return g.Text == text })
	if i < 0 {
		return Request{}, fmt.Errorf("range %q: use one of %s", clip(text), rangeTexts())
	}
	r.Range = Ranges[i]
	return r, nil
}

func rangeTexts() string {
	var s []string
	for _, g := range Ranges {
		s = append(s, g.Text)
	}
	return strings.Join(s, ", ")
}

// quoteAll quotes the first three of ss, and counts the rest.
func quoteAll(ss []string) string {
	var out []string
	for i, s := range ss {
		if i == 3 {
			out = append(out, fmt.Sprintf("and %d more", len(ss)-3))
			break
		}
		out = append(out, fmt.Sprintf("%q", clip(s)))
	}
	return strings.Join(out, ", ")
}

// clip shortens what a caller sent before it is echoed in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

package graphs

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
)

// Answer is DataPath's JSON: the charts of one request over [Start, End] (unix
// seconds) at Step seconds. Truncated: some lines or points were left out
// (MaxSeries, MaxPoints).
type Answer struct {
	Kind      string        `json:"kind"`
	Name      string        `json:"name"`
	Range     string        `json:"range"`
	Start     float64       `json:"start"`
	End       float64       `json:"end"`
	Step      float64       `json:"step"`
	Charts    []ChartAnswer `json:"charts"`
	Truncated bool          `json:"truncated"`
}

// ChartAnswer is one chart: its lines, and the top of its value axis (0: the data's
// maximum).
type ChartAnswer struct {
	ID    string  `json:"id"`
	Title string  `json:"title"`
	Unit  string  `json:"unit"`
	Max   float64 `json:"max,omitempty"`
	Lines []Line  `json:"lines"`
}

// Line is one GPU's (or host's) series. Simulated: the series carry simulated="true"
// (the GPU simulator's, CONTRACTS §11).
type Line struct {
	Label     string       `json:"label"`
	UUID      string       `json:"uuid,omitempty"`
	Simulated bool         `json:"simulated"`
	Points    [][2]float64 `json:"points"`
}

// Data serves GET DataPath?node=NAME|tenant=NAME[&range=R]: the page's charts as
// Answer JSON. 400: a request to correct; 503: no metrics server configured; 502: the
// metrics server could not be reached or refused a query. Errors are
// {"error": "..."}.
func (g *Graphs) Data(w http.ResponseWriter, r *http.Request) {
	if g.src == nil {
		writeJSON(w, http.StatusServiceUnavailable, errorAnswer{notConfigured})
		return
	}
	req, code, err := g.check(r.Context(), r.URL.Query())
	if err != nil {
		writeJSON(w, code, errorAnswer{err.Error()})
		return
	}
	a, err := g.answer(r.Context(), req)
	if err != nil {
		writeJSON(w, http.StatusBadGateway, errorAnswer{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// answer runs req's charts' queries, one after the other.
func (g *Graphs) answer(ctx context.Context, req Request) (*Answer, error) {
	end := g.now().Truncate(req.Step())
	start := end.Add(-req.Range.Span)
	a := &Answer{Kind: string(req.Kind), Name: req.Name, Range: req.Range.Text,
		Start: float64(start.Unix()), End: float64(end.Unix()), Step: req.Step().Seconds(), Charts: []ChartAnswer{}}
	for _, c := range Charts(req) {
		series, truncated, err := g.src.QueryRange(ctx, c.Query, start, end, req.Step())
		if err != nil {
			return nil, err
		}
		a.Truncated = a.Truncated || truncated
		ca := ChartAnswer{ID: c.ID, Title: c.Title, Unit: c.Unit, Max: c.Fixed, Lines: lines(series, req.Kind, c.Legend)}
		if c.Max != "" {
			top, _, err := g.src.QueryRange(ctx, c.Max, start, end, req.Step())
			if err != nil {
				return nil, err
			}
			for _, s := range top {
				for _, p := range s.Points {
					ca.Max = max(ca.Max, p[1])
				}
			}
		}
		a.Charts = append(a.Charts, ca)
	}
	return a, nil
}

// lines names and orders a chart's series: by node, then GPU index, then UUID.
func lines(series []Series, kind Kind, legend string) []Line {
	type keyed struct {
		node string
		gpu  int
		line Line
	}
	var ks []keyed
	for _, s := range series {
		l := s.Labels
		node := cmp.Or(l["node"], l["Hostname"])
		gpu, err := strconv.Atoi(l["gpu"])
		if err != nil {
			gpu = -1
		}
		ln := Line{UUID: l["UUID"], Simulated: l["simulated"] == "true", Points: s.Points}
		switch {
		case legend == "host":
			ln.Label = cmp.Or(l["Hostname"], "(no Hostname)")
		case kind == KindNode:
			ln.Label = "GPU " + l["gpu"]
		default:
			ln.Label = node + " GPU " + l["gpu"]
		}
		if ln.Points == nil {
			ln.Points = [][2]float64{}
		}
		ks = append(ks, keyed{node, gpu, ln})
	}
	slices.SortStableFunc(ks, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(a.node, b.node), cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.line.UUID, b.line.UUID), cmp.Compare(a.line.Label, b.line.Label))
	})
	out := make([]Line, len(ks))
	for i, k := range ks {
		out[i] = k.line
	}
	return out
}

package graphs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Series is one line of a range query's answer: its labels and its points, each
// [unix seconds, value], non-finite values left out.
type Series struct {
	Labels map[string]string
	Points [][2]float64
}

// Limits on what gpuboot reads from the metrics server for one query.
const (
	// MaxBody is the most bytes of one answer; a longer one is an error.
	MaxBody = 8 << 20
	// MaxSeries is the most lines of one chart; the rest are left out and the page
	// says so.
	MaxSeries = 128
)

// Prometheus is the metrics server's HTTP API at a base URL (decision 0692):
// /api/v1/query_range, nothing else.
type Prometheus struct {
	base   *url.URL
	client *http.Client
}

// NewPrometheus returns the API at base (e.g. http://127.0.0.1:9090), with a 15 s
// bound on each query.
func NewPrometheus(base string) (*Prometheus, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("metrics server URL %q: want http://HOST:PORT or https://HOST:PORT", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return &Prometheus{base: u, client: &http.Client{Timeout: 15 * time.Second}}, nil
}

// String is the base URL, for messages.
func (p *Prometheus) String() string { return p.base.String() }

// QueryRange runs query over [start, end] at step and returns at most MaxSeries
// series (more reports truncated). An error says whether the server could not be
// reached, answered with an HTTP error, or refused the query, and quotes its words.
func (p *Prometheus) QueryRange(ctx context.Context, query string, start, end time.Time, step time.Duration) (series []Series, truncated bool, err error) {
	u := *p.base
	u.Path += "/api/v1/query_range"
	u.RawQuery = url.Values{
		"query": {query},
		"start": {strconv.FormatInt(start.Unix(), 10)},
		"end":   {strconv.FormatInt(end.Unix(), 10)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("metrics server %s unreachable: %w", p, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, false, fmt.Errorf("metrics server %s: reading its answer: %w", p, err)
	}
	if len(body) > MaxBody {
		return nil, false, fmt.Errorf("metrics server %s: answer over %d MiB; choose a shorter range", p, MaxBody>>20)
	}
	return decodeMatrix(p.String(), resp.StatusCode, body)
}

// apiAnswer is the envelope of Prometheus' HTTP API (docs: querying/api).
type apiAnswer struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	} `json:"data"`
}

// decodeMatrix reads a query_range answer (HTTP status code, body) from the server
// named from.
func decodeMatrix(from string, code int, body []byte) ([]Series, bool, error) {
	var a apiAnswer
	jsonErr := json.Unmarshal(body, &a)
	switch {
	case jsonErr == nil && a.Status == "error":
		return nil, false, fmt.Errorf("metrics server %s refused the query (HTTP %d, %s): %s", from, code, a.ErrorType, clip(a.Error))
	case code != http.StatusOK:
		return nil, false, fmt.Errorf("metrics server %s answered HTTP %d: %s", from, code, clip(strings.TrimSpace(string(body))))
	case jsonErr != nil:
		return nil, false, fmt.Errorf("metrics server %s: its answer is not Prometheus API JSON: %v", from, jsonErr)
	case a.Status != "success" || a.Data.ResultType != "matrix":
		return nil, false, fmt.Errorf("metrics server %s: answer status %q, result type %q; want success and matrix", from, a.Status, a.Data.ResultType)
	}
	res := a.Data.Result
	truncated := len(res) > MaxSeries
	if truncated {
		res = res[:MaxSeries]
	}
	out := make([]Series, 0, len(res))
	for _, r := range res {
		s := Series{Labels: r.Metric}
		for _, v := range r.Values {
			t, ok := v[0].(float64)
			text, ok2 := v[1].(string)
			if !ok || !ok2 {
				return nil, false, errors.New("metrics server " + from + ": a point is not [time, \"value\"]")
			}
			f, err := strconv.ParseFloat(text, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			s.Points = append(s.Points, [2]float64{t, f})
		}
		if len(s.Points) > MaxPoints+1 {
			s.Points, truncated = s.Points[:MaxPoints+1], true
		}
		out = append(out, s)
	}
	return out, truncated, nil
}

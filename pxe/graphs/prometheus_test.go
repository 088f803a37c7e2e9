package graphs

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestQueryRangeAnswers(t *testing.T) {
	var answer string
	code := 200
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/prom/api/v1/query_range" || r.URL.Query().Get("query") != "up" || r.URL.Query().Get("step") != "12" || r.URL.Query().Get("start") != "100" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusTeapot)
			return
		}
		w.WriteHeader(code)
		fmt.Fprint(w, answer)
	}))
	defer srv.Close()
	p, err := NewPrometheus(srv.URL + "/prom/")
	if err != nil {
		t.Fatal(err)
	}
	q := func() ([]Series, bool, error) {
		return p.QueryRange(context.Background(), "up", time.Unix(100, 0), time.Unix(200, 0), 12*time.Second)
	}

	answer = `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"gpu":"0"},"values":[[100,"1"],[112,"NaN"],[124,"+Inf"],[136,"2.5"]]}]}}`
	s, trunc, err := q()
	if err != nil || trunc || len(s) != 1 || s[0].Labels["gpu"] != "0" || fmt.Sprint(s[0].Points) != "[[100 1] [136 2.5]]" {
		t.Fatalf("matrix: %v %v %v", s, trunc, err)
	}

	var many []string
	for i := range MaxSeries + 5 {
		many = append(many, fmt.Sprintf(`{"metric":{"gpu":"%d"},"values":[[100,"1"]]}`, i))
	}
	answer = `{"status":"success","data":{"resultType":"matrix","result":[` + strings.Join(many, ",") + `]}}`
	if s, trunc, err = q(); err != nil || !trunc || len(s) != MaxSeries {
		t.Errorf("%d series: kept %d, truncated %v, %v", MaxSeries+5, len(s), trunc, err)
	}

	for _, tc := range []struct {
		code         int
		answer, want string
	}{
		{400, `{"status":"error","errorType":"bad_data","error":"parse error"}`, "refused the query (HTTP 400, bad_data): parse error"},
		{503, `overloaded`, "answered HTTP 503: overloaded"},
		{200, `<html>`, "is not Prometheus API JSON"},
		{200, `{"status":"success","data":{"resultType":"vector","result":[]}}`, `result type "vector"`},
		{200, `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[["x",1]]}]}}`, "not [time"},
		{200, `{"status":"success","data":{"resultType":"matrix","result":[` + strings.Repeat(" ", MaxBody) + `]}}`, "answer over 8 MiB"},
	} {
		code, answer = tc.code, tc.answer
		if _, _, err := q(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("HTTP %d %.40q: %v; want %q", tc.code, tc.answer, err, tc.want)
		}
	}

	srv.Close()
	if _, _, err := q(); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("closed server: %v", err)
	}
}

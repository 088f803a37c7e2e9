package admin

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pbjson"
	"github.com/gpurack/gpurack/pxe/checklist"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/protoconv"
	"github.com/gpurack/gpurack/pxe/report"
)

// Handler returns the REST API and the rack view, GET and read-only, and
// Alertmanager's webhook:
//
//	GET  /api/v1/machines?state=S&rack=R     ListMachinesResponse (protojson)
//	GET  /api/v1/machines/{ref}              Machine with history
//	GET  /api/v1/machines/{ref}/history      HistoryResponse
//	GET  /api/v1/history?rack=R              HistoryResponse
//	GET  /api/v1/racks/{rack}/report?format= the rack report (md, json, html)
//	GET  /racks/{rack}                       rack view (HTML)
//	GET  /                                   index of racks (HTML)
//	GET  /graphs?node=N|tenant=T&range=R     per-GPU graphs (HTML; package graphs)
//	GET  /api/v1/graphs?node=N|tenant=T&...  the graphs' data (JSON)
//	POST /api/v1/alerts                      Alertmanager's webhook (alert-sender)
//	GET  /metrics                            gpuboot's metrics (metrics-reader)
//
// Each request needs an operator client certificate or "Authorization: Bearer TOKEN"
// with an operator token, and the level levels gives its route (the reads viewer, and
// a token acts as a viewer; the webhook alert-sender and /metrics metrics-reader,
// levels that reach nothing else).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for route, h := range map[string]http.HandlerFunc{
		routeMachines:       s.apiList,
		routeMachine:        s.apiGet,
		routeMachineHistory: s.apiHistory,
		routeHistory:        s.apiHistory,
		routeReport:         s.apiReport,
		routeRackView:       s.rackView,
		routeIndex:          s.index,
		routeAlerts:         s.apiAlerts,
		routeGraphs:         s.graphs.Page,
		routeGraphsData:     s.graphs.Data,
		routeMetrics:        s.serveMetrics,
	} {
		mux.HandleFunc(route, s.auth(route, h))
	}
	return mux
}

// serveMetrics is GET /metrics: gpuboot's registry, for the metrics server's
// metrics-reader certificate.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metrics == nil {
		http.Error(w, "gpuboot serves no metrics on this handler", http.StatusNotFound)
		return
	}
	s.metrics.ServeHTTP(w, r)
}

type operatorKey struct{}

// auth authenticates a request (an operator client certificate, else a bearer token,
// which acts at tokenLevel) and checks the caller's level for route.
func (s *Server) auth(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var c Caller
		var err error
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			c, err = s.OperatorFromCert(r.TLS.PeerCertificates)
		} else if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			var found bool
			if c.Name, found = s.tokens.Operator(strings.TrimSpace(tok)); !found {
				err = status.Error(codes.Unauthenticated, "unknown operator token")
			}
			c.Level = tokenLevel
		} else {
			err = status.Error(codes.Unauthenticated, "an operator client certificate or operator token is required")
		}
		if err == nil {
			err = c.allow(route)
		}
		if err != nil {
			code := http.StatusUnauthorized
			if status.Code(err) == codes.PermissionDenied {
				code = http.StatusForbidden
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpuboot"`)
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), operatorKey{}, c.Name)))
	}
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := pbjson.Marshal(m)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	code := http.StatusInternalServerError
	switch st.Code() {
	case codes.NotFound:
		code = http.StatusNotFound
	case codes.InvalidArgument:
		code = http.StatusBadRequest
	case codes.FailedPrecondition:
		code = http.StatusConflict
	}
	http.Error(w, st.Message(), code)
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request) {
	req := &bootv1.ListMachinesRequest{Rack: r.URL.Query().Get("rack"), PageToken: r.URL.Query().Get("page_token")}
	for _, st := range r.URL.Query()["state"] {
		for _, one := range strings.Split(st, ",") {
			parsed, err := inventory.ParseState(one)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			req.States = append(req.States, protoconv.StateProto(parsed))
		}
	}
	resp, err := s.list(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (s *Server) apiGet(w http.ResponseWriter, r *http.Request) {
	m, err := s.get(r.Context(), r.PathValue("ref"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, m)
}

func (s *Server) apiHistory(w http.ResponseWriter, r *http.Request) {
	resp, err := s.history(r.Context(), &bootv1.HistoryRequest{Machine: r.PathValue("ref"), Rack: r.URL.Query().Get("rack")})
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (s *Server) apiReport(w http.ResponseWriter, r *http.Request) {
	f, err := report.ParseFormat(r.URL.Query().Get("format"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.rackReport(r.Context(), r.PathValue("rack"), f)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", resp.ContentType)
	w.Header().Set("Content-Disposition", fmt.Sprintf("inline; filename=%q", resp.Filename))
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if f == bootv1.ReportFormat_REPORT_FORMAT_HTML {
		w.Header().Set("Content-Security-Policy", report.HTMLContentSecurityPolicy)
	}
	w.Write(resp.Content)
}

func (s *Server) rackView(w http.ResponseWriter, r *http.Request) {
	resp, err := s.rackReport(r.Context(), r.PathValue("rack"), bootv1.ReportFormat_REPORT_FORMAT_JSON)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	if err := rackViewTemplate.Execute(w, rackViewData(resp.Data, r.Context().Value(operatorKey{}).(string))); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	all, err := s.inv.List(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	type rackRow struct {
		Name    string
		ByState []string
		Total   int
	}
	var rows []rackRow
	for _, rack := range s.racks(all) {
		counts := map[inventory.State]int{}
		total := 0
		for _, m := range all {
			if m.Rack == rack {
				counts[m.State]++
				total++
			}
		}
		row := rackRow{Name: rack, Total: total}
		for _, st := range inventory.States {
			if counts[st] > 0 {
				row.ByState = append(row.ByState, fmt.Sprintf("%s %d", st, counts[st]))
			}
		}
		rows = append(rows, row)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	indexTemplate.Execute(w, map[string]any{"Racks": rows, "Operator": r.Context().Value(operatorKey{})})
}

type viewRow struct {
	Slot, Node, ID, MAC, State, Check, Failing, Health, LastHeartbeat string
}

func rackViewData(d *bootv1.RackReportData, operator string) map[string]any {
	var rows []viewRow
	for _, m := range d.GetMachines() {
		v := viewRow{Slot: m.GetSlot(), Node: m.GetNodeName(), ID: m.GetMachineId(), MAC: m.GetIdentity().GetBootMac(), State: report.StateName(m.GetState())}
		if cl := m.GetChecklist(); cl != nil {
			v.Check = report.StatusName(checklist.Overall(cl))
			v.Failing = strings.Join(checklist.FailingChecks(cl), ", ")
		} else {
			v.Check = "no-report"
		}
		if h := m.GetHealth(); h != nil {
			v.Health = strings.ToLower(strings.TrimPrefix(h.GetState().String(), "HEALTH_STATE_"))
		}
		rows = append(rows, v)
	}
	return map[string]any{"Rack": d.GetRack(), "Rows": rows, "Generated": d.GetGeneratedAt().AsTime().Format("2006-01-02 15:04:05 MST"),
		"GPUs": d.GetGpuCount(), "Healthy": d.GetHealthyGpuCount(), "Simulated": report.SimulatedLine(d), "Operator": operator,
		"Alerts": report.AlertLines(d)}
}

var rackViewTemplate = template.Must(template.New("rack").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>gpuboot rack {{.Rack}}</title><style>` + report.Style + `</style></head><body>
<p><a href="/">racks</a> · signed in as {{.Operator}}</p>
<h1>Rack {{.Rack}}</h1>
<p>{{len .Rows}} machines · GPUs {{.GPUs}}, {{.Healthy}} without a failing check · {{.Generated}} · refreshes every 10 s ·
<a href="/api/v1/racks/{{.Rack}}/report?format=html">report</a></p>
{{if .Simulated}}<p class="simulated"><b>{{.Simulated}}</b></p>
{{end}}{{if .Alerts}}<h2>Active alerts ({{len .Alerts}})</h2>
<table id="alerts"><tr><th>severity</th><th>alert</th><th>node</th><th>GPU</th><th>summary</th><th>since</th><th>runbook</th></tr>
{{range .Alerts}}<tr><td class="sev-{{.Severity}}">{{.Severity}}</td><td><code>{{.Name}}</code></td><td>{{.Where}}</td><td>{{.GPU}}</td><td>{{.Summary}}</td><td>{{.Since}}</td><td>{{if .RunbookLink}}<a href="{{.RunbookLink}}">runbook</a>{{else}}{{.Runbook}}{{end}}</td></tr>
{{end}}</table>
<h2>Machines</h2>
{{end}}<table><tr><th>slot</th><th>node</th><th>machine</th><th>MAC</th><th>state</th><th>last check</th><th>failing</th><th>health</th></tr>
{{range .Rows}}<tr><td>{{.Slot}}</td><td>{{if .Node}}<a href="/graphs?node={{.Node}}" title="GPU graphs">{{.Node}}</a>{{end}}</td><td><a href="/api/v1/machines/{{.ID}}"><code>{{.ID}}</code></a></td><td><code>{{.MAC}}</code></td><td class="{{.State}}">{{.State}}</td><td class="{{.Check}}">{{.Check}}</td><td>{{.Failing}}</td><td>{{.Health}}</td></tr>
{{end}}</table></body></html>
`))

var indexTemplate = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuboot</title><style>` + report.Style + `</style></head><body>
<h1>gpuboot racks</h1><p>signed in as {{.Operator}}</p>
<table><tr><th>rack</th><th>machines</th><th>by state</th></tr>
{{range .Racks}}<tr><td><a href="/racks/{{.Name}}">{{.Name}}</a></td><td>{{.Total}}</td><td>{{range $i, $s := .ByState}}{{if $i}}, {{end}}{{$s}}{{end}}</td></tr>
{{end}}</table></body></html>
`))

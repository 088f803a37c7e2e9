package graphs

import (
	"fmt"
	"strconv"
	"time"
)

// Chart is one graph of a page: a named PromQL range query built here from a
// validated Request, never from anything a browser sends. Max names the query whose
// highest value tops the value axis (memory: the GPUs' total); Fixed tops it at a
// fixed value (utilisation: 100); neither: the data's own maximum.
type Chart struct {
	ID    string
	Title string
	Unit  string
	Query string
	Max   string
	Fixed float64
	// Legend is how a line is named: "gpu" (a GPU: its node, index, UUID) or
	// "host" (a row per Hostname, for the tenant's GPU count).
	Legend string
}

// gpuMetrics are gpuagent's per-GPU series a page draws, one chart each
// (agent/server/metrics.go), labelled gpu, UUID, Hostname, simulated, and node by the
// scrape (docs/monitoring.md, "Scrape jobs").
var gpuMetrics = []struct{ id, title, unit, metric string }{
	{"utilization", "GPU utilisation", "%", "gpurack_gpu_utilization_percent"},
	{"memory", "GPU memory used", "MiB", "gpurack_gpu_memory_used_mib"},
	{"temperature", "GPU temperature", "°C", "gpurack_gpu_temperature_celsius"},
	{"power", "GPU power draw", "W", "gpurack_gpu_power_usage_watts"},
}

// Charts are r's graphs, in page order: the four per-GPU metrics and, for a tenant,
// the GPUs it holds per host (the recording rule gpurack:tenant_gpus_allocated:count
// of docs/monitoring/gpurack-tenants.yaml).
func Charts(r Request) []Chart {
	var out []Chart
	for _, m := range gpuMetrics {
		c := Chart{ID: m.id, Title: m.title, Unit: m.unit, Query: gpuSeries(m.metric, r), Legend: "gpu"}
		switch m.id {
		case "utilization":
			c.Fixed = 100
		case "memory":
			c.Max = "max(" + gpuSeries("gpurack_gpu_memory_total_mib", r) + ")"
		}
		out = append(out, c)
	}
	if r.Kind == KindTenant {
		out = append(out, Chart{ID: "held", Title: "GPUs held, per host", Unit: "GPUs", Legend: "host",
			Query: fmt.Sprintf(`sum by (Hostname) (gpurack:tenant_gpus_allocated:count{tenant=%s})`, label(r.Name))})
	}
	return out
}

// gpuSeries selects metric's series for r's GPUs. A node's: its node label. A
// tenant's: the GPUs a container of one of its namespaces holds, the join of the
// recording rules in docs/monitoring/gpurack-tenants.yaml (gpurack_gpu_allocated, by
// namespace, with gpurack_tenant_namespace), kept per GPU; a GPU two tenants share
// under time-slicing is in both tenants' graphs.
func gpuSeries(metric string, r Request) string {
	if r.Kind == KindNode {
		return fmt.Sprintf(`%s{node=%s}`, metric, label(r.Name))
	}
	return fmt.Sprintf(`%s * on (Hostname, UUID) group_left () %s`, metric, tenantGPUs(r.Name))
}

// tenantGPUs is one series per GPU (Hostname, UUID) that tenant's containers hold,
// of value 1.
func tenantGPUs(tenant string) string {
	return fmt.Sprintf(`max by (Hostname, UUID) (gpurack_gpu_allocated * on (namespace) group_left (tenant) max by (tenant, namespace) (gpurack_tenant_namespace{tenant=%s}))`, label(tenant))
}

// TenantKnown is an expression that has a series when the metrics server knew tenant
// in the span before the query's time: a gpurack_tenant_namespace series names it.
func TenantKnown(tenant string, span time.Duration) string {
	return fmt.Sprintf(`count(last_over_time(gpurack_tenant_namespace{tenant=%s}[%ds]))`, label(tenant), int64(span/time.Second))
}

// label writes s as a PromQL string literal. PromQL's double-quoted strings take Go's
// escapes, so strconv.Quote escapes every quote, backslash and control character; the
// names reaching here are already validated (ParseRequest), this is the second guard.
func label(s string) string { return strconv.Quote(s) }

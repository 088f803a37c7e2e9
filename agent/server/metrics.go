package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/agent/xid"
)

// gpuLabels are dcgm-exporter's label names, so dashboards can join the two exporters
// on UUID or pci_bus_id, and "simulated" ("true" for the GPU simulator's GPUs, CONTRACTS
// §11), so a simulated GPU's figures are never read as a real one's.
var gpuLabels = []string{"gpu", "UUID", "pci_bus_id", "modelName", "Hostname", "simulated"}

func desc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc("gpurack_"+name, help, append(append([]string{}, gpuLabels...), extra...), nil)
}

func nodeDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("gpurack_"+name, help, append([]string{"Hostname"}, labels...), nil)
}

// Collector exports the monitor's latest snapshot, results and health at scrape time.
// It never calls NVML itself: a scrape costs no GPU reads.
type Collector struct {
	Monitor StateReader
	// Hostname is the Hostname label; CurrentHostname, when set, is read at every
	// scrape instead: the agent sets the machine's hostname to the node name when it
	// joins, after its metrics listener has started.
	Hostname        string
	CurrentHostname func() string
	Version         string
	// Rack returns gossip member counts by state; nil without gossip.
	Rack func() map[string]int
	// Holders says which containers hold each GPU (kubelet's pod-resources API,
	// agent/podres); nil, or podres.ErrNoKubelet, where no kubelet runs.
	Holders func(context.Context) (podres.Holders, error)
	// CertificateNotAfter is when the agent certificate in use expires (it changes
	// with each renewal); nil, or a zero time, while the agent has none.
	CertificateNotAfter func() time.Time
	// Also are the collectors of other node parts served beside this one (log
	// shipping's counters, agent/logship).
	Also []prometheus.Collector
}

var (
	mTemp        = desc("gpu_temperature_celsius", "GPU core temperature.")
	mSlowdown    = desc("gpu_slowdown_temperature_celsius", "Temperature at which the GPU starts HW slowdown.")
	mPower       = desc("gpu_power_usage_watts", "GPU power draw.")
	mMemUsed     = desc("gpu_memory_used_mib", "Framebuffer memory in use.")
	mMemTotal    = desc("gpu_memory_total_mib", "Framebuffer memory in total.")
	mUtil        = desc("gpu_utilization_percent", "GPU utilisation over NVML's last sample period.")
	mECCUnc      = desc("gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors since the driver loaded.")
	mECCCorr     = desc("gpu_ecc_corrected_errors", "Volatile corrected ECC errors since the driver loaded.")
	mRemapPend   = desc("gpu_row_remap_pending", "1 when a row remapping waits for a GPU reset.")
	mRemapFail   = desc("gpu_row_remap_failed", "1 when a row remapping failed.")
	mRemapUnc    = desc("gpu_row_remap_uncorrectable_rows", "Rows remapped for uncorrectable errors.")
	mReplays     = desc("gpu_pcie_replays_total", "PCIe replay counter since the driver loaded.")
	mPCIeGen     = desc("gpu_pcie_link_gen", "Current PCIe link generation.")
	mPCIeWidth   = desc("gpu_pcie_link_width", "Current PCIe link width in lanes.")
	mNVLinkUp    = desc("gpu_nvlink_links_active", "NVLink links in the active state.")
	mNVLinkErr   = desc("gpu_nvlink_errors_total", "NVLink DL replay, recovery and CRC errors, all links.")
	mClockEvents = desc("gpu_clock_events_reasons", "Bitmask of active NVML clock event reasons.")
	mHealthyGPU  = desc("gpu_healthy", "1 when no GPU-level check fails on the GPU.")
	mLost        = desc("gpu_lost", "1 when NVML answers ERROR_GPU_IS_LOST for the GPU.")
	mXID         = desc("xid_errors_total", "XID errors seen since the agent started.", "xid", "class")
	mAllocated   = desc("gpu_allocated", "1 for each container kubelet allocated the GPU to (pod-resources API; several under time-slicing).", "namespace", "pod", "container")
	mCheck       = nodeDesc("check_status", "1 for the current status of each check (and GPU, \"\" for node-level).", "check", "gpu_index", "status")
	mHealth      = nodeDesc("node_health_state", "1 for the node's current health state.", "state")
	mGPUHealthy  = nodeDesc("node_gpu_healthy", "The GPUHealthy condition: 1 True, 0 False.", "reason")
	mGPUs        = nodeDesc("node_gpus", "GPUs the backend enumerates.")
	mHealthyGPUs = nodeDesc("node_gpus_healthy", "GPUs with no failing GPU-level check.")
	mDriver      = nodeDesc("driver_loaded", "1 when NVML initialised.")
	mChecklist   = nodeDesc("checklist_duration_seconds", "Duration of the latest checklist run (backend read and checks).")
	mLastRun     = nodeDesc("checklist_last_run_timestamp_seconds", "When the latest checklist finished.")
	mInfo        = nodeDesc("agent_info", "Agent build and configuration.", "version", "backend", "driver_version", "profile", "simulated")
	mRack        = nodeDesc("rack_members", "Gossip members by state, as this agent sees them.", "state")
	mPodRes      = nodeDesc("pod_resources_up", "1 when kubelet's pod-resources API answered (gpu_allocated is current), 0 when it failed.")
	// mCertExpiry has the name and the component and name labels gpuboot's
	// certificates have on its /metrics (pxe/server), so that one alert watches both.
	mCertExpiry = nodeDesc("certificate_expiry_timestamp_seconds", "When a certificate expires (its NotAfter), seconds since the epoch; component gpuagent, name agent: the agent certificate in use.", "component", "name")
)

// Describe sends every descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mTemp, mSlowdown, mPower, mMemUsed, mMemTotal, mUtil, mECCUnc, mECCCorr, mRemapPend,
		mRemapFail, mRemapUnc, mReplays, mPCIeGen, mPCIeWidth, mNVLinkUp, mNVLinkErr, mClockEvents, mHealthyGPU, mLost, mXID,
		mCheck, mHealth, mGPUHealthy, mGPUs, mHealthyGPUs, mDriver, mChecklist, mLastRun, mInfo, mRack, mAllocated, mPodRes, mCertExpiry} {
		ch <- d
	}
}

// Collect reads the monitor's state.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	h := c.Hostname
	if c.CurrentHostname != nil {
		h = c.CurrentHostname()
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	sum := c.Monitor.Health()
	for _, st := range []health.State{health.Healthy, health.Degraded, health.Unhealthy, health.Unknown} {
		gauge(mHealth, b2f(sum.State == st), h, st.String())
	}
	gauge(mGPUHealthy, b2f(sum.GPUHealthy), h, sum.Reason)
	gauge(mHealthyGPUs, float64(sum.HealthyGPUs), h)
	b := c.Monitor.Backend()
	sim := strconv.FormatBool(b.Simulated())
	last := c.Monitor.Last()
	drv, profile := "", ""
	if p := c.Monitor.Profile(); p != nil {
		profile = p.Name
	}
	byIndex := map[int][]string{}
	byUUID := map[string][]string{}
	if last != nil {
		s := &last.Snapshot
		drv = s.Driver.Version
		gauge(mDriver, b2f(s.Driver.Loaded), h)
		gauge(mGPUs, float64(len(s.GPUs)), h)
		gauge(mChecklist, last.FinishedAt.Sub(last.StartedAt).Seconds(), h)
		gauge(mLastRun, float64(last.FinishedAt.UnixNano())/1e9, h)
		unhealthy := map[int]bool{}
		for _, i := range sum.UnhealthyGPUs {
			unhealthy[i] = true
		}
		for i := range s.GPUs {
			g := &s.GPUs[i]
			l := []string{strconv.Itoa(g.Index), g.UUID, g.PCIBusID, g.Name.V, h, sim}
			byIndex[g.Index], byUUID[g.UUID] = l, l
			c.gpu(gauge, counter, g, l)
			gauge(mHealthyGPU, b2f(!unhealthy[g.Index]), l...)
		}
	}
	for _, r := range c.Monitor.Results() {
		idx := ""
		if r.GPU >= 0 {
			idx = strconv.Itoa(r.GPU)
		}
		gauge(mCheck, 1, h, string(r.ID), idx, r.Status.String())
	}
	for k, n := range c.Monitor.XIDs().Counts() {
		l, ok := byIndex[k.GPU]
		if !ok {
			l = []string{strconv.Itoa(k.GPU), "", "", "", h, sim}
		}
		code := strconv.FormatUint(uint64(k.Code), 10)
		counter(mXID, float64(n), append(append([]string{}, l...), code, string(xid.ClassOf(k.Code)))...)
	}
	gauge(mInfo, 1, h, c.Version, b.Name(), drv, profile, sim)
	c.allocations(gauge, h, byUUID)
	if c.Rack != nil {
		for st, n := range c.Rack() {
			gauge(mRack, float64(n), h, st)
		}
	}
	if c.CertificateNotAfter != nil {
		if t := c.CertificateNotAfter(); !t.IsZero() {
			gauge(mCertExpiry, float64(t.Unix()), h, "gpuagent", "agent")
		}
	}
}

// allocations exports which containers hold the GPUs of this snapshot (byUUID: their
// labels), from kubelet's pod-resources API through c.Holders.
func (c *Collector) allocations(gauge func(*prometheus.Desc, float64, ...string), h string, byUUID map[string][]string) {
	if c.Holders == nil {
		return
	}
	holders, err := c.Holders(context.Background())
	if errors.Is(err, podres.ErrNoKubelet) {
		return
	}
	gauge(mPodRes, b2f(err == nil), h)
	for uuid, hs := range holders {
		l, ok := byUUID[uuid]
		if !ok {
			continue // a GPU the agent does not see now; its health metrics say so
		}
		for _, x := range hs {
			gauge(mAllocated, 1, append(append([]string{}, l...), x.Namespace, x.Pod, x.Container)...)
		}
	}
}

func (c *Collector) gpu(gauge, counter func(*prometheus.Desc, float64, ...string), g *gpu.GPU, l []string) {
	gauge(mLost, b2f(g.Lost), l...)
	if g.TemperatureC.OK() {
		gauge(mTemp, float64(g.TemperatureC.V), l...)
	}
	if g.SlowdownC.OK() {
		gauge(mSlowdown, float64(g.SlowdownC.V), l...)
	}
	if g.PowerMW.OK() {
		gauge(mPower, float64(g.PowerMW.V)/1000, l...)
	}
	if g.MemoryUsedMiB.OK() {
		gauge(mMemUsed, float64(g.MemoryUsedMiB.V), l...)
	}
	if g.MemoryTotalMiB.OK() {
		gauge(mMemTotal, float64(g.MemoryTotalMiB.V), l...)
	}
	if g.UtilizationPct.OK() {
		gauge(mUtil, float64(g.UtilizationPct.V), l...)
	}
	if g.ECCUncorrected.OK() {
		gauge(mECCUnc, float64(g.ECCUncorrected.V), l...)
	}
	if g.ECCCorrected.OK() {
		gauge(mECCCorr, float64(g.ECCCorrected.V), l...)
	}
	if g.RowRemap.OK() {
		gauge(mRemapPend, b2f(g.RowRemap.V.Pending), l...)
		gauge(mRemapFail, b2f(g.RowRemap.V.Failed), l...)
		gauge(mRemapUnc, float64(g.RowRemap.V.Uncorrected), l...)
	}
	if g.PCIe.Replays.OK() {
		counter(mReplays, float64(g.PCIe.Replays.V), l...)
	}
	if g.PCIe.CurGen.OK() {
		gauge(mPCIeGen, float64(g.PCIe.CurGen.V), l...)
	}
	if g.PCIe.CurWidth.OK() {
		gauge(mPCIeWidth, float64(g.PCIe.CurWidth.V), l...)
	}
	if g.NVLinks.OK() && len(g.NVLinks.V) > 0 {
		var up, errs float64
		for _, link := range g.NVLinks.V {
			up += b2f(link.Active)
			errs += float64(link.Errors())
		}
		gauge(mNVLinkUp, up, l...)
		counter(mNVLinkErr, errs, l...)
	}
	if g.ClockEvents.OK() {
		gauge(mClockEvents, float64(g.ClockEvents.V), l...)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// MetricsHandler serves /metrics with the agent's collector plus Go and process
// metrics, and /healthz.
func MetricsHandler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(c.Also...)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	return mux
}

//go:build linux

package qemu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/localvol"
)

// Two of the shipped alerts hold for 5 minutes before they fire (`for: 5m`), so
// TestRack starts their faults early and checks the webhook later, while other
// subtests run: a gpurack-local volume filled past 90 % on B while B's and A's node
// checks run (GpurackVolumeNearlyFull, from kubelet's volume statistics), and A's
// gpuagent killed and kept down while B is rolled out (GpurackAgentMissing).

const (
	fullClaim = "full"
	// kubelet's volume statistics are computed every minute (its default
	// volumeStatsAggPeriod), so a filled volume shows in them up to a minute late.
	volumeStatsPeriod = time.Minute
	alertFor          = 5 * time.Minute // the for: clause of both alerts
)

// volumeFault is a gpurack-local claim filled to 60 of its 64 MiB and held mounted
// by a running pod, so that kubelet reports its statistics.
type volumeFault struct {
	filled time.Time // when the write pod ended
	holder *corev1.Pod
}

// fillLocalVolume fills fullClaim (64Mi on gpurack-local, placed by the scheduler on
// the only node with data disks) with 60 MiB, then leaves a pod serving with it
// mounted. localNS must exist.
func fillLocalVolume(t *testing.T, ctx context.Context, admin kubernetes.Interface) *volumeFault {
	t.Helper()
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim(fullClaim, localvol.StorageClass, "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("claim %s: %v", fullClaim, err)
	}
	if p, err := runVolumePod(t, ctx, admin, volumePod("vol-fill", fullClaim, "write", "/data/fill.bin", "60")); err != nil {
		t.Fatalf("writing 60 MiB on the 64Mi claim %s: %v\n%s", fullClaim, err, terminationMessage(p))
	}
	f := &volumeFault{filled: time.Now()}
	holder := volumePod("vol-full-holder", fullClaim, "serve")
	holder.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := admin.CoreV1().Pods(localNS).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatalf("pod holding %s: %v", fullClaim, err)
	}
	f.holder = waitPodRunning(t, ctx, admin, holder)
	t.Logf("claim %s: 60 of 64 MiB written, held mounted by pod %s on %s", fullClaim, holder.Name, f.holder.Spec.NodeName)
	return f
}

// checkVolumeAlert waits for GpurackVolumeNearlyFull for fullClaim at the webhook and
// reports its delay against the bound from the intervals, then frees the claim.
func checkVolumeAlert(t *testing.T, r *Rack, f *volumeFault) {
	ctx, admin, hook := r.ctx, r.admin, r.alerts
	if f == nil {
		t.Fatal("no volume was filled (the gpurack-local subtest did not get that far)")
	}
	want := map[string]string{"namespace": localNS, "persistentvolumeclaim": fullClaim}
	bound := volumeStatsPeriod + alertFor + 3*rackScrape + time.Second
	var got hookAlert
	// B's GPU subtest restarts its kubelet, whose volume statistics then go stale for a
	// scrape or two, which starts the alert's 5 minutes again: when that restart came
	// after the fill, the alert comes up to that much later.
	limit := max(time.Until(f.filled.Add(bound+time.Minute)), 3*time.Minute)
	// So does any failed scrape of that kubelet (a scrape timing out on the loaded TCG
	// guest): the bound then runs from the last one, waited for up to 10 minutes.
	if last, ok := lastKubeletDown(r, f.holder.Spec.NodeName); ok && last.After(f.filled) {
		limit = max(limit, min(time.Until(last.Add(bound+time.Minute)), 10*time.Minute))
		t.Logf("%s's kubelet last failed a scrape %s after the fill: waiting up to %s", f.holder.Spec.NodeName, last.Sub(f.filled).Round(time.Second), limit.Round(time.Second))
	}
	waitFor(t, ctx, limit, "GpurackVolumeNearlyFull for "+localNS+"/"+fullClaim+" at the webhook", func() bool {
		var ok bool
		got, ok = hook.first("GpurackVolumeNearlyFull", "firing", want)
		return ok
	}, func() string { return "the webhook got " + hook.summary() }, func() string { return volumeDiagnostics(r) })
	if got.Labels["severity"] != "warning" || got.Annotations["runbook_url"] != "docs/operations.md#gpurackvolumenearlyfull" {
		t.Errorf("GpurackVolumeNearlyFull: labels %v, annotations %v", got.Labels, got.Annotations)
	}
	t.Logf("volume %s/%s filled to 60 of 64 MiB -> GpurackVolumeNearlyFull at the webhook %s later (bound: kubelet's statistics every %s + for %s + scrape and evaluation every %s = %s, from the fill or from B's kubelet restart if later)",
		localNS, fullClaim, got.At.Sub(f.filled).Round(time.Second), volumeStatsPeriod, alertFor, rackScrape, bound)
	deletePodsIn(t, ctx, admin, localNS, f.holder.Name)
	if err := admin.CoreV1().PersistentVolumeClaims(localNS).Delete(ctx, fullClaim, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete claim %s: %v", fullClaim, err)
	}
}

// lastKubeletDown is the last time in the past 30 minutes that the metrics server
// failed to scrape node's kubelet (up 0), if it did.
func lastKubeletDown(r *Rack, node string) (time.Time, bool) {
	prom := promClient(r.ns)
	defer prom.CloseIdleConnections()
	values, _, err := promQuery(r.ctx, prom, `max_over_time((timestamp(up{job="kubelet",node="`+node+`"} == 0))[30m:5s])`)
	if err != nil || len(values) != 1 {
		return time.Time{}, false
	}
	for _, v := range values {
		if sec, err := strconv.ParseFloat(v, 64); err == nil && sec > 0 {
			return time.Unix(0, int64(sec*1e9)), true
		}
	}
	return time.Time{}, false
}

// killAgent kills node's gpuagent and keeps it down: a runtime drop-in turns off its
// Restart=always for this boot (a runtime mask would not do: /etc's unit outranks
// /run's mask), then SIGKILL. It returns when the kill was done.
func killAgent(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node) time.Time {
	t.Helper()
	// systemctl in the node's own mount namespace (PID 1's, through the host's PID
	// namespace): the pod's view of the host's root has no /run/systemd to reach it by.
	p := hostRootPod(node, "kill-gpuagent", "nsenter -t 1 -m -- sh -c '"+
		"mkdir -p /run/systemd/system/gpuagent.service.d && printf \"[Service]\\nRestart=no\\n\" > /run/systemd/system/gpuagent.service.d/50-test-killed.conf && "+
		"systemctl daemon-reload && systemctl kill --signal=SIGKILL gpuagent.service && sleep 10 && "+
		"! systemctl is-active gpuagent.service && echo gpuagent down: $(systemctl show -p ActiveState,SubState,Result gpuagent.service)'")
	p.Spec.HostNetwork, p.Spec.HostPID = true, true
	got, err := runPodToEnd(ctx, admin, p, 3*time.Minute)
	if err != nil {
		t.Fatalf("killing gpuagent on %s: %v\n%s", node.Name, err, terminationMessage(got))
	}
	deletePodsIn(t, ctx, admin, p.Namespace, p.Name)
	t.Logf("gpuagent on %s killed and masked: %s", node.Name, terminationMessage(got))
	return time.Now()
}

// checkAgentAlert waits for GpurackAgentMissing for node at the webhook, the agent
// having been killed at killed.
func checkAgentAlert(t *testing.T, ctx context.Context, hook *alertHook, node string, killed time.Time) {
	bound := alertFor + 3*rackScrape + time.Second
	var got hookAlert
	waitFor(t, ctx, time.Until(killed.Add(bound+time.Minute)), "GpurackAgentMissing for "+node+" at the webhook", func() bool {
		var ok bool
		got, ok = hook.first("GpurackAgentMissing", "firing", map[string]string{"job": "gpuagent", "node": node})
		return ok
	}, func() string { return "the webhook got " + hook.summary() })
	if got.Labels["severity"] != "critical" || got.Annotations["runbook_url"] != "docs/operations.md#gpurackagentmissing" {
		t.Errorf("GpurackAgentMissing: labels %v, annotations %v", got.Labels, got.Annotations)
	}
	t.Logf("gpuagent on %s killed -> GpurackAgentMissing at the webhook %s later (bound: for %s + scrape and evaluation every %s = %s)",
		node, got.At.Sub(killed).Round(time.Second), alertFor, rackScrape, bound)
}

// volumeDiagnostics is what the rack's Prometheus saw of fullClaim and B's kubelet,
// for a failure's message: the claim's free fraction, the alert's state, and the
// kubelet scrapes that failed in the last 15 minutes (each resets the alert's `for`).
func volumeDiagnostics(r *Rack) string {
	prom := promClient(r.ns)
	defer prom.CloseIdleConnections()
	var out []string
	for _, q := range []string{
		`kubelet_volume_stats_available_bytes{persistentvolumeclaim="` + fullClaim + `"} / kubelet_volume_stats_capacity_bytes{persistentvolumeclaim="` + fullClaim + `"}`,
		`ALERTS{alertname="GpurackVolumeNearlyFull"}`,
		`count_over_time((up{job="kubelet"} == 0)[15m:5s])`,
	} {
		values, _, err := promQuery(r.ctx, prom, q)
		out = append(out, fmt.Sprintf("%s: %v %v", q, values, err))
	}
	return strings.Join(out, "\n")
}

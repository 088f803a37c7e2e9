package alerting

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// deadline bounds each wait: the test's config flushes a group 200 ms after its first
// alert and every second after; a failing notification is retried for 10 s
// (Alertmanager's least notification timeout) before it counts as failed.
const deadline = 45 * time.Second

// labels builds a label set from key, value pairs.
func labels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// fromRule is the alert the metrics server would send for the shipped rule name: its
// labels (severity) and runbook_url, with the labels kv the expression would give.
func fromRule(t *testing.T, rules map[string]rule, name string, kv ...string) alert {
	t.Helper()
	r, ok := rules[name]
	if !ok {
		t.Fatalf("%s has no alert %s", rulesPath, name)
	}
	a := alert{Labels: labels(append([]string{"alertname", name}, kv...)...), Annotations: map[string]string{"runbook_url": r.Annotations["runbook_url"]}}
	for k, v := range r.Labels {
		a.Labels[k] = v
	}
	return a
}

// TestAlertmanagerDelivers runs a real Alertmanager with the shipped configuration,
// its receivers pointed at the test, and checks what reaches them: a critical alert,
// a tenant's alert, one inhibited by its node being down, one silenced with amtool, and
// one whose webhook answers 500.
func TestAlertmanagerDelivers(t *testing.T) {
	rules := shippedRules(t)
	a := startAlertmanager(t, nil)
	for name, check := range map[string]func(*testing.T, *am, map[string]rule){
		"critical pages by webhook and email": deliverCritical,
		"tenant alert reaches its tenant":     deliverTenant,
		"node down inhibits its GPU alerts":   deliverInhibited,
		"silence keeps an alert back":         deliverSilenced,
		"failing receiver is retried":         deliverRetried,
		"web UI is the placeholder":           placeholderUI,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			check(t, a, rules)
		})
	}
}

func deliverCritical(t *testing.T, a *am, rules map[string]rule) {
	sent := fromRule(t, rules, "GpurackXIDFatal", "Hostname", "gpu-0001", "gpu_index", "3")
	a.post(t, sent)
	match := labels("alertname", "GpurackXIDFatal", "Hostname", "gpu-0001")
	var got []alert
	waitFor(t, deadline, "GpurackXIDFatal of gpu-0001 at the paging webhook", func() bool {
		got = a.hook.alerts("paging", match)
		return len(got) > 0
	})
	if !hasLabels(got[0].Labels, sent.Labels) || len(got[0].Labels) != len(sent.Labels) {
		t.Errorf("paging got labels %v, sent %v", got[0].Labels, sent.Labels)
	}
	if url := got[0].Annotations["runbook_url"]; url == "" || url != sent.Annotations["runbook_url"] {
		t.Errorf("paging got runbook_url %q, the rule has %q", url, sent.Annotations["runbook_url"])
	}
	waitFor(t, deadline, "GpurackXIDFatal at gpuboot's webhook", func() bool { return len(a.hook.alerts("gpuboot", match)) > 0 })
	waitFor(t, deadline, "an email to oncall@example.org about GpurackXIDFatal through the relay", func() bool {
		return a.smtp.sent("oncall@example.org", "GpurackXIDFatal")
	})
}

func deliverTenant(t *testing.T, a *am, rules map[string]rule) {
	a.post(t, fromRule(t, rules, "GpurackVolumeNearlyFull", "namespace", "vision-dev", "persistentvolumeclaim", "data", "tenant", "vision"))
	match := labels("alertname", "GpurackVolumeNearlyFull", "tenant", "vision")
	waitFor(t, deadline, "GpurackVolumeNearlyFull of tenant vision at tenant-vision's webhook", func() bool {
		return len(a.hook.alerts("tenant-vision", match)) > 0
	})
	waitFor(t, deadline, "an email to vision-oncall@example.org", func() bool {
		return a.smtp.sent("vision-oncall@example.org", "GpurackVolumeNearlyFull")
	})
}

// deliverInhibited: with gpu-0002 NotReady, its XID alert is muted and never sent,
// while the same alert on gpu-0003 is.
func deliverInhibited(t *testing.T, a *am, rules map[string]rule) {
	a.post(t, fromRule(t, rules, "GpurackNodeNotReady", "Hostname", "gpu-0002", "node", "gpu-0002"))
	waitFor(t, deadline, "GpurackNodeNotReady of gpu-0002 at the paging webhook", func() bool {
		return len(a.hook.alerts("paging", labels("alertname", "GpurackNodeNotReady", "Hostname", "gpu-0002"))) > 0
	})
	before := a.metric(t, "alertmanager_notifications_suppressed_total", `reason="inhibition"`)
	inhibited := labels("alertname", "GpurackXIDFatal", "Hostname", "gpu-0002")
	a.post(t, fromRule(t, rules, "GpurackXIDFatal", "Hostname", "gpu-0002", "gpu_index", "0"),
		fromRule(t, rules, "GpurackXIDFatal", "Hostname", "gpu-0003", "gpu_index", "0"))
	waitFor(t, deadline, "GpurackXIDFatal of gpu-0003 (another node) at the paging webhook", func() bool {
		return len(a.hook.alerts("paging", labels("alertname", "GpurackXIDFatal", "Hostname", "gpu-0003"))) > 0
	})
	waitFor(t, deadline, "gpu-0002's GpurackXIDFatal to be muted at a flush, or sent", func() bool {
		return a.metric(t, "alertmanager_notifications_suppressed_total", `reason="inhibition"`) > before || len(a.hook.alerts("", inhibited)) > 0
	})
	if st := a.status(t, labels("alertname", "GpurackXIDFatal", "Hostname", "gpu-0002", "gpu_index", "0")); st.State != "suppressed" || len(st.InhibitedBy) == 0 {
		t.Errorf("gpu-0002's GpurackXIDFatal is %+v, want suppressed, inhibited by its NodeNotReady", st)
	}
	if got := a.hook.alerts("", inhibited); len(got) > 0 {
		t.Errorf("the inhibited GpurackXIDFatal of gpu-0002 reached a receiver: %v", got)
	}
}

// deliverSilenced: a silence added with amtool keeps gpu 3's ECC alert out of its
// group's notification while gpu 1's, in the same group, is sent; expiring the
// silence lets it through.
func deliverSilenced(t *testing.T, a *am, rules map[string]rule) {
	out, err := exec.Command(a.amtool, "silence", "add", "--alertmanager.url="+a.url, "--author=gpurack-test",
		"--comment=GPU 3 of gpu-0004 is being replaced", "--duration=1h",
		`alertname="GpurackECCUncorrected"`, `Hostname="gpu-0004"`, `gpu="3"`).CombinedOutput()
	if err != nil {
		t.Fatalf("amtool silence add: %v\n%s", err, out)
	}
	id := strings.TrimSpace(string(out))
	before := a.metric(t, "alertmanager_notifications_suppressed_total", `reason="silence"`)
	silenced := labels("alertname", "GpurackECCUncorrected", "Hostname", "gpu-0004", "gpu", "3")
	a.post(t, fromRule(t, rules, "GpurackECCUncorrected", "Hostname", "gpu-0004", "gpu", "3", "UUID", "GPU-3"),
		fromRule(t, rules, "GpurackECCUncorrected", "Hostname", "gpu-0004", "gpu", "1", "UUID", "GPU-1"))
	waitFor(t, deadline, "gpu 1's GpurackECCUncorrected of gpu-0004 at the paging webhook", func() bool {
		return len(a.hook.alerts("paging", labels("alertname", "GpurackECCUncorrected", "Hostname", "gpu-0004", "gpu", "1"))) > 0
	})
	waitFor(t, deadline, "gpu 3's alert to be muted at a flush, or sent", func() bool {
		return a.metric(t, "alertmanager_notifications_suppressed_total", `reason="silence"`) > before || len(a.hook.alerts("", silenced)) > 0
	})
	if st := a.status(t, silenced); st.State != "suppressed" || len(st.SilencedBy) != 1 || st.SilencedBy[0] != id {
		t.Errorf("gpu 3's alert is %+v, want suppressed by silence %s", st, id)
	}
	if got := a.hook.alerts("", silenced); len(got) > 0 {
		t.Fatalf("the silenced alert reached a receiver: %v", got)
	}
	if out, err := exec.Command(a.amtool, "silence", "expire", "--alertmanager.url="+a.url, id).CombinedOutput(); err != nil {
		t.Fatalf("amtool silence expire %s: %v\n%s", id, err, out)
	}
	waitFor(t, deadline, "gpu 3's alert at the paging webhook once its silence expired", func() bool {
		return len(a.hook.alerts("paging", silenced)) > 0
	})
}

// deliverRetried: a webhook that answers 500 is retried, the failure shows in
// alertmanager_notifications_failed_total, and the alert arrives once it answers.
func deliverRetried(t *testing.T, a *am, rules map[string]rule) {
	a.hook.setFail("gpu-0005", true)
	failed := func() float64 {
		return a.metric(t, "alertmanager_notifications_failed_total", `integration="webhook"`, `reason="serverError"`)
	}
	before := failed()
	a.post(t, fromRule(t, rules, "GpurackGPULost", "Hostname", "gpu-0005", "gpu", "0", "UUID", "GPU-0"))
	waitFor(t, deadline, "paging's webhook to be tried again after a 500", func() bool { return a.hook.failed("paging", "gpu-0005") >= 2 })
	waitFor(t, deadline, "alertmanager_notifications_failed_total{integration=\"webhook\"} to rise", func() bool { return failed() > before })
	if n := a.metric(t, "alertmanager_notification_requests_failed_total", `integration="webhook"`); n < 2 {
		t.Errorf("alertmanager_notification_requests_failed_total{integration=\"webhook\"} is %v after two failed requests", n)
	}
	match := labels("alertname", "GpurackGPULost", "Hostname", "gpu-0005")
	a.hook.setFail("gpu-0005", false)
	waitFor(t, deadline, "GpurackGPULost at the paging webhook once it answers", func() bool { return len(a.hook.alerts("paging", match)) > 0 })
}

// placeholderUI: the web UI, which hack/k8s-bins.sh does not build (decision 0691),
// answers with the page that says so, at / and /ui/.
func placeholderUI(t *testing.T, a *am, _ map[string]rule) {
	for _, path := range []string{"/", "/ui/"} {
		resp, err := client.Get(a.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "without its web UI") {
			t.Errorf("GET %s: %s, %q; want the placeholder page", path, resp.Status, body)
		}
	}
}

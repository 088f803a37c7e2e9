package monitoring

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// quarantineTaint is the taint gpuboot and the agent put on a node whose GPUs failed,
// which GpurackNodeQuarantined watches through kube-state-metrics.
const quarantineTaint = "gpurack.io/gpu-unhealthy"

// nodeState follows two simulated nodes' objects through kube-state-metrics to the
// rules: a posts Ready and b NotReady (as their kubelets would), a is then tainted
// gpu-unhealthy; kube_node_status_condition and kube_node_spec_taint say so by node, and
// GpurackNodeQuarantined (a) and GpurackNodeNotReady (b, with Hostname) pend, their
// `for` being 15 and 10 minutes.
func nodeState(t *testing.T, promURL string, cs kubernetes.Interface, a, b string) {
	setReady(t, cs, a, corev1.ConditionTrue)
	setReady(t, cs, b, corev1.ConditionFalse)
	eventually(t, 30*time.Second, "kube_node_status_condition by node", func() error {
		return valuesByNode(promURL, `kube_node_status_condition{job="kube-state-metrics", condition="Ready", status="true"}`,
			map[string]string{a: "1", b: "0"})
	})
	at := time.Now()
	taint(t, cs, a, corev1.Taint{Key: quarantineTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	q := fmt.Sprintf(`kube_node_spec_taint{key=%q}`, quarantineTaint)
	eventually(t, 30*time.Second, "kube_node_spec_taint for "+a, func() error {
		return valuesByNode(promURL, q, map[string]string{a: "1"})
	})
	t.Logf("taint on %s → kube_node_spec_taint: %s (scrape interval %s)", a, time.Since(at).Round(time.Millisecond), scrapeInterval)
	if s, err := query(promURL, q); err != nil || len(s) != 1 || s[0].Metric["effect"] != "NoSchedule" {
		t.Errorf("%s: %v %v, want one series, %s's, effect NoSchedule", q, s, err, a)
	}
	eventually(t, 30*time.Second, "GpurackNodeQuarantined and GpurackNodeNotReady pending", func() error {
		for _, w := range []struct{ alert, node string }{{"GpurackNodeQuarantined", a}, {"GpurackNodeNotReady", b}} {
			if err := pending(promURL, w.alert, map[string]string{"node": w.node}); err != nil {
				return err
			}
		}
		return pending(promURL, "GpurackNodeNotReady", map[string]string{"Hostname": b})
	})
}

// valuesByNode compares the series of q by node with want; nodes not in want are not
// looked at.
func valuesByNode(promURL, q string, want map[string]string) error {
	s, err := query(promURL, q)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, x := range s {
		got[x.Metric["node"]] = fmt.Sprint(x.Value[1])
	}
	for n, v := range want {
		if got[n] != v {
			return fmt.Errorf("%s{node=%q} = %q, want %s (all: %v)", q, n, got[n], v, got)
		}
	}
	return nil
}

// pending returns nil when Prometheus has alert pending with labels among its own.
func pending(promURL, alert string, labels map[string]string) error {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := getJSON(promURL+"/api/v1/alerts", &r); err != nil {
		return err
	}
next:
	for _, x := range r.Data.Alerts {
		if x.Labels["alertname"] != alert || x.State != "pending" {
			continue
		}
		for k, v := range labels {
			if x.Labels[k] != v {
				continue next
			}
		}
		return nil
	}
	return fmt.Errorf("no %s pending with %v among %d alerts", alert, labels, len(r.Data.Alerts))
}

// setReady posts node's Ready condition, as its kubelet would, with a fresh heartbeat
// (the node lifecycle controller marks it Unknown only after its grace period).
func setReady(t *testing.T, cs kubernetes.Interface, node string, status corev1.ConditionStatus) {
	ctx := context.Background()
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: "SimulatedKubelet",
			LastHeartbeatTime: now, LastTransitionTime: now}
		conds := []corev1.NodeCondition{ready}
		for _, c := range n.Status.Conditions {
			if c.Type != corev1.NodeReady {
				conds = append(conds, c)
			}
		}
		n.Status.Conditions = conds
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("post %s's Ready=%s: %v", node, status, err)
	}
}

// taint adds x to node's taints.
func taint(t *testing.T, cs kubernetes.Interface, node string, x corev1.Taint) {
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, x)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("taint %s with %s: %v", node, x.Key, err)
	}
}

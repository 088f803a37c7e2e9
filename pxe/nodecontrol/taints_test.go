package nodecontrol

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The contract's names, spelled out: a changed constant must fail here.
const (
	TaintUnvalidated    = "gpurack.io/unvalidated"
	TaintGPUUnhealthy   = "gpurack.io/gpu-unhealthy"
	ConditionGPUHealthy = "GPUHealthy"
)

func node(taints []corev1.Taint, cond corev1.ConditionStatus, since time.Time) *corev1.Node {
	n := &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}}
	if cond != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: ConditionGPUHealthy, Status: cond, LastTransitionTime: metav1.NewTime(since)}}
	}
	return n
}

func has(ts []corev1.Taint, key string) bool {
	for _, t := range ts {
		if t.Key == key {
			return true
		}
	}
	return false
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	unval := corev1.Taint{Key: TaintUnvalidated, Effect: corev1.TaintEffectNoSchedule}
	unhealthy := corev1.Taint{Key: TaintGPUUnhealthy, Effect: corev1.TaintEffectNoSchedule}
	other := corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}
	f := Facts{Known: true, Effect: corev1.TaintEffectNoSchedule}
	ready := f
	ready.Ready = true

	cases := []struct {
		name                  string
		node                  *corev1.Node
		facts                 Facts
		unval, unhealthy, chg bool
	}{
		{"not ready keeps unvalidated", node([]corev1.Taint{unval, other}, "", now), f, true, false, false},
		{"ready removes unvalidated", node([]corev1.Taint{unval, other}, "", now), ready, false, false, true},
		{"unknown node left alone", node([]corev1.Taint{unval}, corev1.ConditionFalse, now), Facts{}, true, false, false},
		{"False taints at once", node([]corev1.Taint{other}, corev1.ConditionFalse, now), ready, false, true, true},
		{"False already tainted", node([]corev1.Taint{unhealthy}, corev1.ConditionFalse, now), ready, false, true, false},
		{"True clears", node([]corev1.Taint{unhealthy, other}, corev1.ConditionTrue, now.Add(-31*time.Second)), ready, false, false, true},
		{"True already clear", node([]corev1.Taint{other}, corev1.ConditionTrue, now), ready, false, false, false},
		{"Unknown leaves taint", node([]corev1.Taint{unhealthy}, corev1.ConditionUnknown, now), ready, false, true, false},
		{"no condition, no taint", node(nil, "", now), ready, false, false, false},
	}
	for _, c := range cases {
		d := Decide(c.node, c.facts, now)
		if has(d.Taints, TaintUnvalidated) != c.unval || has(d.Taints, TaintGPUUnhealthy) != c.unhealthy || d.Changed != c.chg {
			t.Errorf("%s: taints %v changed %v", c.name, taintKeys(d.Taints), d.Changed)
		}
		if c.name != "unknown node left alone" && has(c.node.Spec.Taints, "nvidia.com/gpu") && !has(d.Taints, "nvidia.com/gpu") {
			t.Errorf("%s: dropped a foreign taint", c.name)
		}
	}
	// NoExecute when configured.
	ne := ready
	ne.Effect = corev1.TaintEffectNoExecute
	d := Decide(node(nil, corev1.ConditionFalse, now), ne, now)
	if len(d.Taints) != 1 || d.Taints[0].Effect != corev1.TaintEffectNoExecute {
		t.Errorf("NoExecute: %v", d.Taints)
	}
}

// TestTaintMirrorsConditionOnce: the agent already holds GPUHealthy False until its
// checks have been better for --clear-after (health.Tracker), so when the condition
// turns True the controller removes the taint at once. A second hold here, measured
// from the condition's lastTransitionTime, would delay every clear twice (decision
// 0205).
func TestTaintMirrorsConditionOnce(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	unhealthy := corev1.Taint{Key: TaintGPUUnhealthy, Effect: corev1.TaintEffectNoSchedule}
	// The facts as gpuboot builds them from its default configuration.
	f := Facts{Known: true, Ready: true, Effect: corev1.TaintEffectNoSchedule}
	d := Decide(node([]corev1.Taint{unhealthy}, corev1.ConditionTrue, now.Add(-time.Second)), f, now)
	if has(d.Taints, TaintGPUUnhealthy) || !d.Changed {
		t.Errorf("GPUHealthy True for 1 s: taints %v changed %v; want the taint removed at once", taintKeys(d.Taints), d.Changed)
	}
}

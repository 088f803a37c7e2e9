package nodecontrol

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Taint keys gpurack uses (CONTRACTS §5).
const (
	TaintUnvalidated  = "gpurack.io/unvalidated"
	TaintGPUUnhealthy = "gpurack.io/gpu-unhealthy"
	// ConditionGPUHealthy is the Node condition the agent writes.
	ConditionGPUHealthy = corev1.NodeConditionType("GPUHealthy")
)

// Facts is what the controller decides a Node's taints from.
type Facts struct {
	// Ready is true when the machine's lifecycle state is ready.
	Ready bool
	// Known is true when the Node belongs to a machine in gpuboot's inventory.
	Known bool
	// Effect of the unhealthy taint; ClearAfter the hysteresis before clearing it.
	Effect     corev1.TaintEffect
	ClearAfter time.Duration
}

// Decision is the taint list a Node should have, and when to look again.
type Decision struct {
	Taints  []corev1.Taint
	Changed bool
	// RequeueAfter > 0: look again then (a pending clear).
	RequeueAfter time.Duration
}

// Decide is the controller's pure decision for one Node at now: remove
// gpurack.io/unvalidated once the machine is ready; add gpurack.io/gpu-unhealthy at once
// while GPUHealthy is False; remove it once GPUHealthy has been True for ClearAfter
// (measured from the condition's lastTransitionTime). Unknown or missing GPUHealthy
// leaves the unhealthy taint as it is. Nodes gpuboot does not know are left alone.
func Decide(node *corev1.Node, f Facts, now time.Time) Decision {
	if !f.Known {
		return Decision{Taints: node.Spec.Taints}
	}
	var out []corev1.Taint
	var d Decision
	hasUnhealthy := false
	for _, t := range node.Spec.Taints {
		switch {
		case t.Key == TaintUnvalidated && f.Ready:
			d.Changed = true
			continue
		case t.Key == TaintGPUUnhealthy:
			hasUnhealthy = true
		}
		out = append(out, t)
	}
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == ConditionGPUHealthy {
			cond = &node.Status.Conditions[i]
		}
	}
	switch {
	case cond != nil && cond.Status == corev1.ConditionFalse && !hasUnhealthy:
		added := metav1.NewTime(now)
		out = append(out, corev1.Taint{Key: TaintGPUUnhealthy, Effect: f.Effect, TimeAdded: &added})
		d.Changed = true
	case cond != nil && cond.Status == corev1.ConditionTrue && hasUnhealthy:
		healthyFor := now.Sub(cond.LastTransitionTime.Time)
		if healthyFor >= f.ClearAfter {
			kept := out[:0]
			for _, t := range out {
				if t.Key != TaintGPUUnhealthy {
					kept = append(kept, t)
				}
			}
			out = kept
			d.Changed = true
		} else {
			d.RequeueAfter = f.ClearAfter - healthyFor
		}
	}
	d.Taints = out
	return d
}

package nodecontrol

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/internal/nodecontract"
)

// Facts is what the controller decides a Node's taints from.
type Facts struct {
	// Ready is true when the machine's lifecycle state is ready.
	Ready bool
	// Known is true when the Node belongs to a machine in gpuboot's inventory.
	Known bool
	// Effect of the unhealthy taint.
	Effect corev1.TaintEffect
}

// Decision is the taint list a Node should have.
type Decision struct {
	Taints  []corev1.Taint
	Changed bool
}

// Decide is the controller's pure decision for one Node at now: remove
// gpurack.io/unvalidated once the machine is ready; add gpurack.io/gpu-unhealthy while
// GPUHealthy is False and remove it while GPUHealthy is True. The taint mirrors the
// condition with no delay of its own: the agent holds GPUHealthy False until its checks
// have been better for its --clear-after, and per-GPU health needs that same hysteresis
// (decision 0205). Unknown or missing GPUHealthy leaves the unhealthy taint as it is.
// Nodes gpuboot does not know are left alone. now stamps an added taint's timeAdded.
func Decide(node *corev1.Node, f Facts, now time.Time) Decision {
	if !f.Known {
		return Decision{Taints: node.Spec.Taints}
	}
	var out []corev1.Taint
	var d Decision
	hasUnhealthy := false
	for _, t := range node.Spec.Taints {
		switch {
		case t.Key == nodecontract.TaintUnvalidated && f.Ready:
			d.Changed = true
			continue
		case t.Key == nodecontract.TaintGPUUnhealthy:
			hasUnhealthy = true
		}
		out = append(out, t)
	}
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == nodecontract.ConditionGPUHealthy {
			cond = &node.Status.Conditions[i]
		}
	}
	switch {
	case cond != nil && cond.Status == corev1.ConditionFalse && !hasUnhealthy:
		added := metav1.NewTime(now)
		out = append(out, corev1.Taint{Key: nodecontract.TaintGPUUnhealthy, Effect: f.Effect, TimeAdded: &added})
		d.Changed = true
	case cond != nil && cond.Status == corev1.ConditionTrue && hasUnhealthy:
		kept := out[:0]
		for _, t := range out {
			if t.Key != nodecontract.TaintGPUUnhealthy {
				kept = append(kept, t)
			}
		}
		out = kept
		d.Changed = true
	}
	d.Taints = out
	return d
}

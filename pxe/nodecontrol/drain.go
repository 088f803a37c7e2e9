package nodecontrol

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/internal/nodecontract"
)

// What a rollout does to Nodes (pxe/rollout.Nodes): cordon with a gpurack.io/ taint
// (the enroller may change only those, decision 0687), drain through the eviction API
// (PodDisruptionBudgets hold), uncordon.

// Cordon puts TaintRollout (NoSchedule) on the Node, so that nothing new lands there.
func (c *Cluster) Cordon(ctx context.Context, node string) error {
	return c.setTaint(ctx, node, corev1.Taint{Key: nodecontract.TaintRollout, Effect: corev1.TaintEffectNoSchedule}, true)
}

// Uncordon removes TaintRollout; a Node without it, or gone, is left as it is.
func (c *Cluster) Uncordon(ctx context.Context, node string) error {
	err := c.setTaint(ctx, node, corev1.Taint{Key: nodecontract.TaintRollout}, false)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// setTaint adds taint (present) or removes every taint with its key, with the guarded
// patch the node controller uses; a concurrent change is read afresh and tried again.
func (c *Cluster) setTaint(ctx context.Context, name string, taint corev1.Taint, present bool) error {
	for attempt := 0; ; attempt++ {
		node, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		has := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taint.Key })
		if has == present {
			return nil
		}
		var taints []corev1.Taint
		if present {
			now := metav1.Now()
			taint.TimeAdded = &now
			taints = append(slices.Clone(node.Spec.Taints), taint)
		} else {
			taints = slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == taint.Key })
		}
		err = c.patchTaints(ctx, node, taints)
		if err == nil || !errors.Is(err, errStale) || attempt == 4 {
			return err
		}
	}
}

// Drain asks the eviction API to evict every pod on the Node that a drain evicts, as
// `kubectl drain --ignore-daemonsets --delete-emptydir-data` does: not DaemonSet
// pods, not static (mirror) pods, not pods that have ended. It returns the pods still
// on the Node ("namespace/name"): those being deleted, and those an eviction was
// refused for (a PodDisruptionBudget answers 429). Call it again until none is left.
func (c *Cluster) Drain(ctx context.Context, node string) ([]string, error) {
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("listing the pods on node %s: %w", node, err)
	}
	var left []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if !drained(p) {
			continue
		}
		name := p.Namespace + "/" + p.Name
		left = append(left, name)
		if p.DeletionTimestamp != nil {
			continue
		}
		err := c.client.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
		switch {
		case err == nil, apierrors.IsTooManyRequests(err):
		case apierrors.IsNotFound(err):
			left = left[:len(left)-1]
		default:
			return left, fmt.Errorf("evicting pod %s: %w", name, err)
		}
	}
	return left, nil
}

// drained reports whether a drain evicts p.
func drained(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, o := range p.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "DaemonSet" {
			return false
		}
	}
	return true
}

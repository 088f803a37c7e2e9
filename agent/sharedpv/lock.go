package sharedpv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// recordAnnotation holds the election record on the ConfigMap, in the format
// client-go's ConfigMap lock used before it was removed.
const recordAnnotation = "control-plane.alpha.kubernetes.io/leader"

// configMapLock is a resourcelock.Interface on a ConfigMap. The agents elect through
// it rather than a Lease because they authenticate as their nodes, and the
// NodeRestriction admission plugin lets a node touch no Lease but its own heartbeat
// in kube-node-lease. Every update carries the resourceVersion its Get read, so of
// two candidates updating at once one gets a conflict, as with a Lease.
type configMapLock struct {
	client         typedcorev1.ConfigMapsGetter
	namespace      string
	name, identity string

	mu sync.Mutex
	cm *corev1.ConfigMap // as last read or written
}

var _ resourcelock.Interface = (*configMapLock)(nil)

// Get implements resourcelock.Interface.
func (l *configMapLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	cm, err := l.client.ConfigMaps(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	var rec resourcelock.LeaderElectionRecord
	raw := []byte(cm.Annotations[recordAnnotation])
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return nil, nil, fmt.Errorf("ConfigMap %s/%s: annotation %s: %w", l.namespace, l.name, recordAnnotation, err)
		}
	}
	return &rec, raw, nil
}

// Create implements resourcelock.Interface.
func (l *configMapLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	raw, err := json.Marshal(ler)
	if err != nil {
		return err
	}
	cm, err := l.client.ConfigMaps(l.namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.namespace, Name: l.name, Annotations: map[string]string{recordAnnotation: string(raw)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	return nil
}

// Update implements resourcelock.Interface.
func (l *configMapLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	cm := l.cm
	l.mu.Unlock()
	if cm == nil {
		return errors.New("configmap lock: update before get or create")
	}
	raw, err := json.Marshal(ler)
	if err != nil {
		return err
	}
	cm = cm.DeepCopy()
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[recordAnnotation] = string(raw)
	cm, err = l.client.ConfigMaps(l.namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			l.mu.Lock()
			l.cm = nil
			l.mu.Unlock()
		}
		return err
	}
	l.mu.Lock()
	l.cm = cm
	l.mu.Unlock()
	return nil
}

// RecordEvent implements resourcelock.Interface: the agent logs its own turns.
func (l *configMapLock) RecordEvent(string) {}

// Identity implements resourcelock.Interface.
func (l *configMapLock) Identity() string { return l.identity }

// Describe implements resourcelock.Interface.
func (l *configMapLock) Describe() string { return "configmap " + l.namespace + "/" + l.name }

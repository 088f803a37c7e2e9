package localpv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/record"

	"github.com/gpurack/gpurack/internal/localvol"
)

// Capacity publishes this node's free space for each StorageClass of the provisioner,
// as CSIStorageCapacity objects the scheduler reads (the CSIDriver named after the
// provisioner has storageCapacity: true): Capacity is the free space of all ready data
// disks, MaximumVolumeSize the largest one disk has, since a volume lives on one disk.
// It also says, on a claim no node can hold, what the largest free space is: the
// scheduler's own message names no figure.
type Capacity struct {
	Node    string
	Store   *Store
	Client  kubernetes.Interface
	Classes storagelisters.StorageClassLister
	// Capacities lists the CSIStorageCapacity objects in localvol.Namespace (every
	// node's); Claims every claim.
	Capacities storagelisters.CSIStorageCapacityLister
	Claims     corelisters.PersistentVolumeClaimLister
	Events     record.EventRecorder
	Log        *slog.Logger

	mu   sync.Mutex
	said map[types.UID]string // claim → the message last recorded on it
}

// Publish writes this node's capacity objects, one per StorageClass of the
// provisioner, and deletes its objects for classes that are gone. It returns the
// disks' space it published.
func (c *Capacity) Publish(ctx context.Context) ([]DiskSpace, error) {
	spaces, err := c.Store.Space()
	if err != nil {
		return nil, err
	}
	var total, largest int64
	for _, d := range spaces {
		total += d.Free
		largest = max(largest, d.Free)
	}
	classes, err := c.Classes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, sc := range classes {
		if sc.Provisioner != localvol.Provisioner {
			continue
		}
		name := capacityName(sc.Name, c.Node)
		want[name] = true
		if err := c.apply(ctx, name, sc.Name, total, largest); err != nil {
			return nil, err
		}
	}
	mine, err := c.Capacities.CSIStorageCapacities(localvol.Namespace).List(labels.SelectorFromSet(labels.Set{localvol.LabelNode: c.Node}))
	if err != nil {
		return nil, err
	}
	for _, o := range mine {
		if !want[o.Name] {
			err := c.Client.StorageV1().CSIStorageCapacities(localvol.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("delete capacity %s: %w", o.Name, err)
			}
		}
	}
	return spaces, nil
}

func (c *Capacity) apply(ctx context.Context, name, class string, total, largest int64) error {
	obj := &storagev1.CSIStorageCapacity{
		ObjectMeta:        metav1.ObjectMeta{Name: name, Namespace: localvol.Namespace, Labels: map[string]string{localvol.LabelNode: c.Node}},
		NodeTopology:      &metav1.LabelSelector{MatchLabels: map[string]string{localvol.TopologyKey: c.Node}},
		StorageClassName:  class,
		Capacity:          resource.NewQuantity(total, resource.BinarySI),
		MaximumVolumeSize: resource.NewQuantity(largest, resource.BinarySI),
	}
	api := c.Client.StorageV1().CSIStorageCapacities(localvol.Namespace)
	old, err := c.Capacities.CSIStorageCapacities(localvol.Namespace).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // the cache was behind
			return nil
		}
	case err != nil:
	case old.Capacity.Cmp(*obj.Capacity) == 0 && old.MaximumVolumeSize.Cmp(*obj.MaximumVolumeSize) == 0:
		return nil
	default:
		obj.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publish capacity %s/%s: %w", localvol.Namespace, name, err)
	}
	return nil
}

// capacityName is the object holding node's capacity for class: "class.node" while it
// fits a name, else a digest of both.
func capacityName(class, node string) string {
	if n := class + "." + node; len(n) <= 253 {
		return n
	}
	sum := sha256.Sum256([]byte(class + "\x00" + node))
	return "gpurack-local-" + hex.EncodeToString(sum[:16])
}

// TellUnplaceable records a Warning on every unbound claim of the provisioner's classes
// that asks for more than any node's largest free space, naming that space and its
// node. One node says it, the one holding the largest space (ties: the first name), so
// a claim gets one voice, not one per node; it says it again only when the figure
// changes.
func (c *Capacity) TellUnplaceable() error {
	claims, err := c.Claims.List(labels.Everything())
	if err != nil {
		return err
	}
	caps, err := c.Capacities.CSIStorageCapacities(localvol.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.said == nil {
		c.said = map[types.UID]string{}
	}
	pending := map[types.UID]bool{}
	for _, cl := range claims {
		if cl.Spec.VolumeName != "" || cl.Spec.StorageClassName == nil || cl.Status.Phase != corev1.ClaimPending {
			continue
		}
		pending[cl.UID] = true
		if msg := c.unplaceable(cl, *cl.Spec.StorageClassName, caps); msg != "" && c.said[cl.UID] != msg {
			c.Events.Event(cl, corev1.EventTypeWarning, "NoNodeHasRoom", msg)
			c.said[cl.UID] = msg
		}
	}
	for uid := range c.said {
		if !pending[uid] {
			delete(c.said, uid)
		}
	}
	return nil
}

// unplaceable is the message for claim cl of class, or "" when some node can hold it,
// the class is not the provisioner's, or another node is the one to say it.
func (c *Capacity) unplaceable(cl *corev1.PersistentVolumeClaim, class string, caps []*storagev1.CSIStorageCapacity) string {
	req, ok := cl.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return ""
	}
	var best *storagev1.CSIStorageCapacity
	for _, o := range caps {
		if o.StorageClassName != class || o.Labels[localvol.LabelNode] == "" || o.MaximumVolumeSize == nil {
			continue
		}
		if best == nil || o.MaximumVolumeSize.Cmp(*best.MaximumVolumeSize) > 0 ||
			(o.MaximumVolumeSize.Cmp(*best.MaximumVolumeSize) == 0 && o.Labels[localvol.LabelNode] < best.Labels[localvol.LabelNode]) {
			best = o
		}
	}
	if best == nil || best.Labels[localvol.LabelNode] != c.Node || req.Cmp(*best.MaximumVolumeSize) <= 0 {
		return ""
	}
	nodes := 0
	for _, o := range caps {
		if o.StorageClassName == class {
			nodes++
		}
	}
	return fmt.Sprintf("the claim asks for %s of %s, but the largest free space on any node's data disks is %s (node %s, of %d nodes publishing %s capacity): ask for at most that, free space by deleting volumes, or add data disks",
		req.String(), class, human(best.MaximumVolumeSize.Value()), c.Node, nodes, class)
}

package tenants

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// FieldManager is the server-side-apply field manager of `tenants apply`.
const FieldManager = "gpurack-tenants"

// Action is what applying does to one object.
type Action string

const (
	Create    Action = "create"
	Update    Action = "update"
	Unchanged Action = "unchanged"
	Delete    Action = "delete"
)

// Change is one object and what applying the file does to it.
type Change struct {
	Action Action
	Object Object // for Delete only GVR and the object's name and namespace are set
}

// Plan is the difference between the file and the cluster.
type Plan struct {
	Changes []Change
}

// Deletions are the changes that delete something: objects managed by
// `tenants apply` that the file no longer asks for. A namespace's contents
// are not listed separately; they go with it.
func (p *Plan) Deletions() []Change {
	var out []Change
	for _, c := range p.Changes {
		if c.Action == Delete {
			out = append(out, c)
		}
	}
	return out
}

// Describe names what a deletion removes, for the operator's question.
func (c Change) Describe() string {
	if c.Object.GVR == gvrNamespace {
		return c.Object.Key() + " (and every object in it: pods, Secrets, volume claims)"
	}
	return c.Object.Key()
}

// ComputePlan compares want with the cluster: each object is created when
// missing, updated when a server-side dry-run apply would change it, and
// every object labeled as managed by tenants apply that want lacks is to be
// deleted. It changes nothing.
func ComputePlan(ctx context.Context, client dynamic.Interface, want []Object) (*Plan, error) {
	p := &Plan{}
	wanted := map[string]bool{}
	for _, o := range want {
		wanted[o.Key()] = true
		ri := resourceFor(client, o)
		cur, err := ri.Get(ctx, o.Obj.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			p.Changes = append(p.Changes, Change{Create, o})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", o.Key(), err)
		}
		after, err := apply(ctx, ri, o, true)
		if err != nil {
			hint := ""
			switch {
			case o.GVR == gvrPriorityClass && apierrors.IsInvalid(err):
				hint = "; a PriorityClass's value cannot change: give the tier a new name, or remove it, apply with --prune, and add it back"
			case cur.GetDeletionTimestamp() != nil:
				hint = "; it is being deleted: wait until it is gone and apply again"
			}
			return nil, fmt.Errorf("dry-run apply %s: %w%s", o.Key(), err, hint)
		}
		if reflect.DeepEqual(comparable(cur), comparable(after)) {
			p.Changes = append(p.Changes, Change{Unchanged, o})
		} else {
			p.Changes = append(p.Changes, Change{Update, o})
		}
	}
	selector := metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy}
	var gone []Change
	goneNS := map[string]bool{}
	for _, gvr := range managedResources {
		list, err := client.Resource(gvr).List(ctx, selector)
		if apierrors.IsNotFound(err) && gvr.Group == kueueGV.Group {
			continue // Kueue's CRDs are not installed: no queues to prune
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		for _, item := range list.Items {
			k := key(gvr.Resource, item.GetNamespace(), item.GetName())
			if wanted[k] || item.GetDeletionTimestamp() != nil {
				continue
			}
			u := &unstructured.Unstructured{}
			u.SetNamespace(item.GetNamespace())
			u.SetName(item.GetName())
			gone = append(gone, Change{Delete, Object{GVR: gvr, Obj: u}})
			if gvr == gvrNamespace {
				goneNS[item.GetName()] = true
			}
		}
	}
	for _, c := range gone {
		if namespaced[c.Object.GVR] && goneNS[c.Object.Obj.GetNamespace()] {
			continue
		}
		p.Changes = append(p.Changes, c)
	}
	return p, nil
}

// comparable strips what every write changes (resourceVersion, timestamps,
// managedFields, generation), leaving what the object says.
func comparable(u *unstructured.Unstructured) map[string]any {
	c := u.DeepCopy()
	for _, f := range []string{"resourceVersion", "managedFields", "generation", "creationTimestamp", "uid"} {
		unstructured.RemoveNestedField(c.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(c.Object, "status")
	return c.Object
}

func resourceFor(client dynamic.Interface, o Object) dynamic.ResourceInterface {
	return resourceIn(client, o.GVR, o.Obj.GetNamespace())
}

func resourceIn(client dynamic.Interface, gvr schema.GroupVersionResource, ns string) dynamic.ResourceInterface {
	if ns != "" {
		return client.Resource(gvr).Namespace(ns)
	}
	return client.Resource(gvr)
}

func apply(ctx context.Context, ri dynamic.ResourceInterface, o Object, dryRun bool) (*unstructured.Unstructured, error) {
	body, err := json.Marshal(o.Obj.Object)
	if err != nil {
		return nil, err
	}
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return ri.Patch(ctx, o.Obj.GetName(), types.ApplyPatchType, body, opts)
}

// PruneRefusedError is returned by Execute when the plan deletes objects
// and pruning was not confirmed. It names them.
type PruneRefusedError struct{ Deletions []Change }

func (e *PruneRefusedError) Error() string {
	var names []string
	for _, c := range e.Deletions {
		names = append(names, "  "+c.Describe())
	}
	return fmt.Sprintf("the tenants file no longer asks for %d object(s) that tenants apply created; nothing was deleted:\n%s\n"+
		"add them back to the file, or re-run with --prune (or answer yes) to delete them", len(e.Deletions), strings.Join(names, "\n"))
}

// Execute carries out p: it applies every created or updated object with
// server-side apply, and deletes the plan's deletions only when prune is
// true; otherwise, if there are any, it applies nothing and returns a
// *PruneRefusedError. Namespaces are deleted in the background: the
// apiserver empties them first.
func Execute(ctx context.Context, client dynamic.Interface, p *Plan, prune bool) error {
	if del := p.Deletions(); len(del) > 0 && !prune {
		return &PruneRefusedError{Deletions: del}
	}
	for _, c := range p.Changes {
		if c.Action != Create && c.Action != Update {
			continue
		}
		if _, err := apply(ctx, resourceFor(client, c.Object), c.Object, false); err != nil {
			return fmt.Errorf("apply %s: %w", c.Object.Key(), err)
		}
	}
	// Delete in reverse apply order: bindings before roles, namespaces
	// before the PriorityClasses their pods use.
	del := p.Deletions()
	sort.SliceStable(del, func(i, j int) bool {
		return slices.Index(managedResources, del[i].Object.GVR) > slices.Index(managedResources, del[j].Object.GVR)
	})
	bg := metav1.DeletePropagationBackground
	for _, c := range del {
		err := resourceFor(client, c.Object).Delete(ctx, c.Object.Obj.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s: %w", c.Object.Key(), err)
		}
	}
	return nil
}

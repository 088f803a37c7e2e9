package localpv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/gpurack/gpurack/internal/localvol"
	"github.com/gpurack/gpurack/internal/volclaim"
)

// defaultDirectoryMode is a new volume's directory mode without the directoryMode
// parameter: writable by the pod whatever user it runs as, like an emptyDir.
const defaultDirectoryMode os.FileMode = 0o777

// Provisioner is one node's provisioner of gpurack-local volumes, run by the
// library's controller in that node's agent. It takes only the claims the scheduler
// placed on its node (Qualifier) and deletes only its node's volumes
// (DeletionGuard); every agent runs one, without leader election.
type Provisioner struct {
	Node  string
	Store *Store
	// Changed is called after a volume was made or removed (the capacity is
	// published again); nil: nothing.
	Changed func()
}

var (
	_ controller.Provisioner   = (*Provisioner)(nil)
	_ controller.Qualifier     = (*Provisioner)(nil)
	_ controller.DeletionGuard = (*Provisioner)(nil)
)

// ShouldProvision implements controller.Qualifier: a claim the scheduler placed on
// this node.
func (p *Provisioner) ShouldProvision(_ context.Context, claim *corev1.PersistentVolumeClaim) bool {
	return claim.Annotations[localvol.AnnSelectedNode] == p.Node
}

// ShouldDelete implements controller.DeletionGuard: a volume of this node.
func (p *Provisioner) ShouldDelete(_ context.Context, pv *corev1.PersistentVolume) bool {
	return pv.Labels[localvol.LabelNode] == p.Node
}

// Provision implements controller.Provisioner: a directory with a project quota of the
// claim's size on the data disk with the most free space, as a `local` volume bound to
// this node. The errors are the claim's ProvisioningFailed events: each says what to
// change.
func (p *Provisioner) Provision(_ context.Context, o controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	if o.SelectedNodeName != p.Node {
		return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: "the claim is for node " + o.SelectedNodeName}
	}
	mode, err := classMode(o.StorageClass.Name, o.StorageClass.Parameters)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	claim := o.PVC
	if err := checkClaim(claim); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	req := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	v, err := p.Store.Create(o.PVName, req.Value(), mode, claim.Namespace+"/"+claim.Name)
	if errors.Is(err, ErrNoRoom) {
		// Capacity is published, so the scheduler should not have picked this node; it
		// read an old figure. A node cannot hand the claim back (NodeRestriction lets a
		// node update only a claim's status), so the claim waits here, retried with
		// backoff, until room is freed or someone deletes the pod and claim: the event
		// says so.
		return nil, controller.ProvisioningFinished, fmt.Errorf("%w; the claim waits on node %s until room is freed there (or delete the pod and the claim, and create them again, for the scheduler to pick another node)", err, p.Node)
	}
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if p.Changed != nil {
		p.Changed()
	}
	return p.volume(o, v), controller.ProvisioningFinished, nil
}

func (p *Provisioner) volume(o controller.ProvisionOptions, v Volume) *corev1.PersistentVolume {
	fs := corev1.PersistentVolumeFilesystem
	reclaim := corev1.PersistentVolumeReclaimDelete
	if o.StorageClass.ReclaimPolicy != nil {
		reclaim = *o.StorageClass.ReclaimPolicy
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName, Labels: map[string]string{localvol.LabelNode: p.Node}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: o.PVC.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   o.PVC.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			MountOptions:                  o.StorageClass.MountOptions,
			VolumeMode:                    &fs,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: v.Path}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: localvol.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{p.Node}}},
			}}}},
		},
	}
}

// Delete implements controller.Provisioner: the volume's directory, quota and record.
// It goes by the volume's name, never by the path the PV carries, and refuses a PV
// whose path is not the one the store would have made.
func (p *Provisioner) Delete(_ context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.Local == nil {
		return fmt.Errorf("volume %s is not a local volume; gpurack-local made no such volume", pv.Name)
	}
	v, ok, err := p.Store.Lookup(pv.Name)
	if err != nil {
		return err
	}
	if !ok {
		// Already gone (deleted before the PV was, or its disk was replaced).
		return nil
	}
	if filepath.Clean(pv.Spec.Local.Path) != v.Path {
		return fmt.Errorf("volume %s names path %s, but the store made it at %s: nothing deleted", pv.Name, pv.Spec.Local.Path, v.Path)
	}
	if err := p.Store.Delete(pv.Name); err != nil {
		return err
	}
	if p.Changed != nil {
		p.Changed()
	}
	return nil
}

// classMode reads the StorageClass's parameters: only directoryMode, an octal mode.
func classMode(class string, params map[string]string) (os.FileMode, error) {
	mode := defaultDirectoryMode
	var unknown []string
	for k, v := range params {
		if k != localvol.ParamDirectoryMode {
			unknown = append(unknown, k)
			continue
		}
		m, err := volclaim.ParseMode(class, k, v)
		if err != nil {
			return 0, err
		}
		mode = m
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return 0, fmt.Errorf("StorageClass %s: unknown parameter %s: gpurack-local takes only %s; fix the class (a new class, as parameters cannot change) and recreate the claim",
			class, strings.Join(quoteAll(unknown), ", "), localvol.ParamDirectoryMode)
	}
	return mode, nil
}

// checkClaim refuses what a directory on one node cannot be.
func checkClaim(c *corev1.PersistentVolumeClaim) error {
	for _, m := range c.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			return fmt.Errorf("claim %s/%s asks for %s; a gpurack-local volume lives on one node (ReadWriteOnce or ReadWriteOncePod); for sharing use gpurack-shared", c.Namespace, c.Name, m)
		}
	}
	return volclaim.CheckDirectoryClaim(c, localvol.StorageClass)
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

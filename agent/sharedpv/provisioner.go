package sharedpv

import (
	"context"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/gpurack/gpurack/internal/sharedvol"
	"github.com/gpurack/gpurack/internal/volclaim"
)

// annOnDelete, on a volume this provisioner made, keeps the class's onDelete: the
// class may be gone (or changed by a new one of its name) when the volume is deleted.
const annOnDelete = "gpurack.io/shared-on-delete"

// defaultDirectoryMode is a new volume's directory mode without directoryMode:
// writable by the pods whatever user they run as, like an emptyDir.
const defaultDirectoryMode os.FileMode = 0o777

// Provisioner provisions gpurack-shared claims. Only the elected agent runs one.
type Provisioner struct {
	// Mount returns the directory where server:share is mounted, mounting it first
	// (with options, the class's or the volume's mount options) when it is not.
	Mount func(ctx context.Context, server, share string, options []string) (string, error)
	// Claim returns claim namespace/name (for a view's source); Volume returns volume
	// name; Views the names of the views of volume name.
	Claim  func(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	Volume func(name string) (*corev1.PersistentVolume, error)
	Views  func(name string) ([]string, error)
	// Deleted is told what happened to a deleted volume's directory; nil: nothing.
	Deleted func(pv, what string)
	// Now is the clock of archive names (time.Now when nil).
	Now func() time.Time
}

var _ controller.Provisioner = (*Provisioner)(nil)

// class is what a gpurack-shared StorageClass's parameters say.
type class struct {
	server, share, onDelete string
	mode                    os.FileMode
}

// Provision implements controller.Provisioner: a new directory on the class's export,
// or, for a claim naming another (sharedvol.AnnViewOf), a read-only view of that
// claim's directory. The errors are the claim's ProvisioningFailed events: each says
// what to change.
func (p *Provisioner) Provision(ctx context.Context, o controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	c, err := parseClass(o.StorageClass.Name, o.StorageClass.Parameters)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	claim := o.PVC
	if err := volclaim.CheckDirectoryClaim(claim, sharedvol.StorageClass); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if src := claim.Annotations[sharedvol.AnnViewOf]; src != "" {
		pv, err := p.view(claim, src, o)
		return pv, controller.ProvisioningFinished, err
	}
	dir, err := p.Mount(ctx, c.server, c.share, o.StorageClass.MountOptions)
	if err != nil {
		// Not final: the export may come back, and the claim's next try mounts it.
		return nil, controller.ProvisioningInBackground, fmt.Errorf("NFS export %s:%s: %w", c.server, c.share, err)
	}
	name := sharedvol.DirName(claim.Namespace, claim.Name, o.PVName)
	if err := (Export{Dir: dir}).Create(name, o.PVName, c.mode); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	pv := p.volume(o, c.server, sharedvol.VolumePath(c.share, name), onlyReadOnly(claim))
	pv.Annotations = map[string]string{annOnDelete: c.onDelete}
	return pv, controller.ProvisioningFinished, nil
}

// view is a read-only volume showing the directory of claim src's volume.
func (p *Provisioner) view(claim *corev1.PersistentVolumeClaim, src string, o controller.ProvisionOptions) (*corev1.PersistentVolume, error) {
	if !onlyReadOnly(claim) {
		return nil, fmt.Errorf("claim %s/%s names %s in %s but asks for %v; a view is ReadOnlyMany only", claim.Namespace, claim.Name, src, sharedvol.AnnViewOf, claim.Spec.AccessModes)
	}
	sc, err := p.Claim(claim.Namespace, src)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s is a view of claim %s: %w", claim.Namespace, claim.Name, src, err)
	}
	if sc.Status.Phase != corev1.ClaimBound || sc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("claim %s/%s is a view of claim %s, which is %s, not Bound yet; it is tried again", claim.Namespace, claim.Name, src, sc.Status.Phase)
	}
	spv, err := p.Volume(sc.Spec.VolumeName)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s is a view of claim %s: its volume: %w", claim.Namespace, claim.Name, src, err)
	}
	if spv.Annotations[annProvisionedBy] != sharedvol.Provisioner || spv.Spec.NFS == nil || spv.Labels[sharedvol.LabelView] != "" {
		return nil, fmt.Errorf("claim %s/%s is a view of claim %s, whose volume %s is not a gpurack-shared volume of its own; name a gpurack-shared claim that is not itself a view", claim.Namespace, claim.Name, src, spv.Name)
	}
	pv := p.volume(o, spv.Spec.NFS.Server, spv.Spec.NFS.Path, true)
	pv.Labels = map[string]string{sharedvol.LabelView: spv.Name}
	return pv, nil
}

// annProvisionedBy is set by the provisioner library on the volumes it creates.
const annProvisionedBy = "pv.kubernetes.io/provisioned-by"

func (p *Provisioner) volume(o controller.ProvisionOptions, server, nfsPath string, readOnly bool) *corev1.PersistentVolume {
	fs := corev1.PersistentVolumeFilesystem
	reclaim := corev1.PersistentVolumeReclaimDelete
	if o.StorageClass.ReclaimPolicy != nil {
		reclaim = *o.StorageClass.ReclaimPolicy
	}
	opts := o.StorageClass.MountOptions
	if readOnly {
		opts = readOnlyOptions(opts)
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: o.PVC.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   o.PVC.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			MountOptions:                  opts,
			VolumeMode:                    &fs,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: server, Path: nfsPath, ReadOnly: readOnly}},
		},
	}
}

// Delete implements controller.Provisioner: a view's deletion touches nothing on the
// export; a volume's archives its directory (or removes it: onDelete delete), once no
// view of it is left. It goes by the volume's name and refuses a path that is not the
// one Provision would have made.
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.NFS == nil {
		return fmt.Errorf("volume %s is not an nfs volume; gpurack-shared made no such volume", pv.Name)
	}
	if pv.Labels[sharedvol.LabelView] != "" {
		return nil
	}
	views, err := p.Views(pv.Name)
	if err != nil {
		return err
	}
	if len(views) > 0 {
		return fmt.Errorf("volume %s still has read-only views (%s); delete their claims first, and it is archived then", pv.Name, strings.Join(views, ", "))
	}
	name := path.Base(pv.Spec.NFS.Path)
	share := strings.TrimSuffix(pv.Spec.NFS.Path, "/"+sharedvol.VolumesDir+"/"+name)
	if err := sharedvol.CheckShare(share); err != nil || sharedvol.VolumePath(share, name) != pv.Spec.NFS.Path {
		return fmt.Errorf("volume %s names path %s, not <share>/%s/<directory>: nothing deleted", pv.Name, pv.Spec.NFS.Path, sharedvol.VolumesDir)
	}
	if err := sharedvol.CheckDirName(name, pv.Name); err != nil {
		return fmt.Errorf("volume %s: %w: nothing deleted", pv.Name, err)
	}
	dir, err := p.Mount(ctx, pv.Spec.NFS.Server, share, pv.Spec.MountOptions)
	if err != nil {
		return fmt.Errorf("NFS export %s:%s: %w", pv.Spec.NFS.Server, share, err)
	}
	e := Export{Dir: dir}
	what := "removed " + name
	if pv.Annotations[annOnDelete] == sharedvol.OnDeleteDelete {
		err = e.Remove(name, pv.Name)
	} else {
		now := time.Now
		if p.Now != nil {
			now = p.Now
		}
		var to string
		to, err = e.Archive(name, pv.Name, now())
		what = "archived " + name + " as " + sharedvol.ArchiveDir + "/" + path.Base(to)
		if to == "" {
			what = name + " was gone already"
		}
	}
	if err == nil && p.Deleted != nil {
		p.Deleted(pv.Name, what)
	}
	return err
}

// parseClass reads a gpurack-shared StorageClass's parameters.
func parseClass(name string, params map[string]string) (class, error) {
	c := class{server: params[sharedvol.ParamServer], share: params[sharedvol.ParamShare], onDelete: sharedvol.OnDeleteArchive, mode: defaultDirectoryMode}
	known := []string{sharedvol.ParamServer, sharedvol.ParamShare, sharedvol.ParamOnDelete, sharedvol.ParamDirectoryMode}
	var unknown []string
	for k := range params {
		if !slices.Contains(known, k) {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return c, fmt.Errorf("StorageClass %s: unknown parameter %s: gpurack-shared takes %s; fix the class (a new class, as parameters cannot change) and recreate the claim",
			name, strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	if err := sharedvol.CheckServer(c.server); err != nil {
		return c, fmt.Errorf("StorageClass %s: parameter %s: %w", name, sharedvol.ParamServer, err)
	}
	if err := sharedvol.CheckShare(c.share); err != nil {
		return c, fmt.Errorf("StorageClass %s: parameter %s: %w", name, sharedvol.ParamShare, err)
	}
	if v, ok := params[sharedvol.ParamOnDelete]; ok {
		if v != sharedvol.OnDeleteArchive && v != sharedvol.OnDeleteDelete {
			return c, fmt.Errorf("StorageClass %s: parameter %s=%q: want %q or %q", name, sharedvol.ParamOnDelete, v, sharedvol.OnDeleteArchive, sharedvol.OnDeleteDelete)
		}
		c.onDelete = v
	}
	if v, ok := params[sharedvol.ParamDirectoryMode]; ok {
		m, err := volclaim.ParseMode(name, sharedvol.ParamDirectoryMode, v)
		if err != nil {
			return c, err
		}
		c.mode = m
	}
	return c, nil
}

// readOnlyOptions is opts with "ro" in place of any "rw". kubelet mounts an nfs volume
// read-only only when the pod's claim reference says readOnly; it does not read the
// volume's nfs.readOnly, so a read-only volume carries "ro" in its mount options, and
// every pod's mount of it is read-only (a mount of its own: the kernel does not share
// an NFS superblock between ro and rw mounts).
func readOnlyOptions(opts []string) []string {
	out := make([]string, 0, len(opts)+1)
	for _, o := range opts {
		if o != "rw" && o != "ro" {
			out = append(out, o)
		}
	}
	return append(out, "ro")
}

// onlyReadOnly: the claim asks for ReadOnlyMany and nothing else.
func onlyReadOnly(c *corev1.PersistentVolumeClaim) bool {
	return len(c.Spec.AccessModes) > 0 && !slices.ContainsFunc(c.Spec.AccessModes, func(m corev1.PersistentVolumeAccessMode) bool {
		return m != corev1.ReadOnlyMany
	})
}

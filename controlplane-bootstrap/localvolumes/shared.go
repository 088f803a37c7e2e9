package localvolumes

import (
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/localvol"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// SharedRole names the Role and RoleBinding in localvol.Namespace that let every node
// take part in the election of the gpurack-shared provisioner (on the ConfigMap
// sharedvol.Lease: NodeRestriction refuses a node every Lease but its own heartbeat).
// The volumes it writes are under Role and Policy.
const SharedRole = "gpurack:shared-volumes"

// sharedObjects are the gpurack-shared objects: the election's Role and binding
// always, the StorageClass when the cluster has an NFS export.
func sharedObjects(nfs *clusterconfig.NFS) []joinconfig.Object {
	objs := []joinconfig.Object{
		joinconfig.Role(localvol.Namespace, SharedRole, LeaseRules()...),
		joinconfig.RoleBinding(localvol.Namespace, SharedRole, joinconfig.Group(joinconfig.NodesGroup)),
	}
	if nfs != nil {
		objs = append(objs, joinconfig.Object{GVR: gvrStorageClass, Obj: SharedStorageClass(nfs)})
	}
	return objs
}

// LeaseRules let a node create, read and renew the gpurack-shared provisioner's
// election record, and no other ConfigMap in localvol.Namespace (create cannot be
// narrowed to a name; a node could create other ConfigMaps there, which nothing reads).
func LeaseRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{sharedvol.Lease}, Verbs: []string{"get", "update", "patch"}},
	}
}

// SharedStorageClass is gpurack-shared on the cluster's export: Immediate binding
// (a shared volume is on no node), reclaim Delete (the directory then archived,
// unless onDelete says delete), the export's mount options, not the default class.
// Its parameters cannot change once created: to move the export, delete the class
// (the volumes keep theirs) and init again.
func SharedStorageClass(nfs *clusterconfig.NFS) *storagev1.StorageClass {
	reclaim := corev1.PersistentVolumeReclaimDelete
	binding := storagev1.VolumeBindingImmediate
	expand := false
	return &storagev1.StorageClass{
		TypeMeta:    metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass"},
		ObjectMeta:  metav1.ObjectMeta{Name: sharedvol.StorageClass},
		Provisioner: sharedvol.Provisioner,
		Parameters: map[string]string{sharedvol.ParamServer: nfs.Server, sharedvol.ParamShare: nfs.Share,
			sharedvol.ParamOnDelete: nfs.OnDelete},
		MountOptions:         nfs.MountOptions,
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &binding,
		AllowVolumeExpansion: &expand,
	}
}

// isShared is the CEL condition that PersistentVolume o is annotated as a
// gpurack-shared volume.
func isShared(o string) string {
	return fmt.Sprintf("(has(%[1]s.metadata.annotations) && %[2]q in %[1]s.metadata.annotations && %[1]s.metadata.annotations[%[2]q] == %[3]q)",
		o, localvol.AnnProvisionedBy, sharedvol.Provisioner)
}

// onExport is the CEL condition that PersistentVolume o is an nfs volume, on no node,
// whose path is one volume directory under the export's volumes/ (sharedvol.DirName's
// characters only, so no '..' and no deeper path); false without an export.
func onExport(nfs *clusterconfig.NFS) string {
	if nfs == nil {
		return "false"
	}
	re := "^" + regexp.QuoteMeta(nfs.Share+"/"+sharedvol.VolumesDir+"/") + "[a-z0-9][-a-z0-9._]*$"
	return fmt.Sprintf("has(o.spec.nfs) && !has(o.spec.local) && !has(o.spec.nodeAffinity) && o.spec.nfs.server == %q && o.spec.nfs.path.matches(%q)",
		nfs.Server, re)
}

// sharedMessage says where a node may write gpurack-shared volumes.
func sharedMessage(nfs *clusterconfig.NFS) string {
	if nfs == nil {
		return "node {node} may not write gpurack-shared volumes: the cluster has no NFS export (storage.nfs in cluster.yaml)"
	}
	return fmt.Sprintf("node {node} may only write gpurack-shared volumes that are nfs volumes on no node, at %s:%s/%s/<one directory> (the cluster's export)",
		nfs.Server, nfs.Share, sharedvol.VolumesDir)
}

package localvolumes_test

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/localvolumes"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/localvol"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// sharedPV is a volume as the elected agent provisions it on testNFS.
func sharedPV(name, path string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{localvol.AnnProvisionedBy: sharedvol.Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              sharedvol.StorageClass,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: testNFS.Server, Path: path}},
		},
	}
}

// TestInitAppliesSharedClass: with storage.nfs set, init made gpurack-shared on the
// export (Immediate, the export's parameters and mount options) and the Role of the
// provisioner's election.
func TestInitAppliesSharedClass(t *testing.T) {
	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	ctx := ctxFor(t, time.Minute)
	class, err := cs.StorageV1().StorageClasses().Get(ctx, sharedvol.StorageClass, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"server": "192.0.2.10", "share": "/srv/gpurack", "onDelete": "archive"}
	if class.Provisioner != sharedvol.Provisioner || !reflect.DeepEqual(class.Parameters, want) ||
		*class.VolumeBindingMode != storagev1.VolumeBindingImmediate || !reflect.DeepEqual(class.MountOptions, testNFS.MountOptions) {
		t.Errorf("class %s: provisioner %s, parameters %v, binding %s, mount options %v", class.Name, class.Provisioner, class.Parameters, *class.VolumeBindingMode, class.MountOptions)
	}
	role, err := cs.RbacV1().Roles(localvol.Namespace).Get(ctx, localvolumes.SharedRole, metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(role.Rules, localvolumes.LeaseRules()) {
		t.Errorf("role %s: %v %+v", localvolumes.SharedRole, err, role)
	}
}

// TestNodeWritesSharedVolumesOnTheExport checks, as node-a, that a node may create and
// delete a gpurack-shared volume at a directory of the export's volumes/, create and
// renew the provisioner's election record and read no other ConfigMap there, and that the policy refuses a shared volume on
// another server, above or beside volumes/, deeper, or pinned to a node.
func TestNodeWritesSharedVolumesOnTheExport(t *testing.T) {
	c := testcluster.Shared(t)
	node := nodeClient(t, c, "node-a")
	admin := c.Clientset(t)
	pvs := node.CoreV1().PersistentVolumes()
	ctx := ctxFor(t, 2*time.Minute)

	own := sharedPV("sv-own", "/srv/gpurack/volumes/alpha_data_sv-own")
	if _, err := pvs.Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node-a creating a shared volume on the export: %v", err)
	}
	if err := pvs.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("node-a deleting it: %v", err)
	}
	bad := map[string]*corev1.PersistentVolume{
		"on another server":   sharedPV("sv-server", "/srv/gpurack/volumes/a_b_sv-server"),
		"the export itself":   sharedPV("sv-root", "/srv/gpurack"),
		"the volumes dir":     sharedPV("sv-volumes", "/srv/gpurack/volumes/"),
		"beside volumes":      sharedPV("sv-archived", "/srv/gpurack/archived/a_b_sv-archived"),
		"deeper":              sharedPV("sv-deeper", "/srv/gpurack/volumes/a_b_c/d"),
		"another export":      sharedPV("sv-etc", "/etc/volumes/a_b_sv-etc"),
		"a local path":        sharedPV("sv-local", ""),
		"with node affinity":  sharedPV("sv-affinity", "/srv/gpurack/volumes/a_b_sv-affinity"),
		"up and out (dotdot)": sharedPV("sv-dotdot", "/srv/gpurack/volumes/../../etc"),
	}
	bad["on another server"].Spec.NFS.Server = "198.51.100.7"
	bad["a local path"].Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: localvol.MountRoot + "/x"}}
	bad["a local path"].Spec.NodeAffinity = localPV("x", "node-a").Spec.NodeAffinity
	bad["with node affinity"].Spec.NodeAffinity = localPV("x", "node-a").Spec.NodeAffinity
	for what, pv := range bad {
		_, err := pvs.Create(ctx, pv, metav1.CreateOptions{})
		wantPolicyRefusal(t, "node-a creating a shared volume "+what, err, "node node-a", "192.0.2.10:/srv/gpurack/volumes/")
		if err == nil {
			admin.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
		}
	}

	cms := node.CoreV1().ConfigMaps(localvol.Namespace)
	record := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: sharedvol.Lease}}
	if _, err := cms.Create(ctx, record, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("node-a creating the provisioner's election record: %v", err)
	}
	t.Cleanup(func() {
		admin.CoreV1().ConfigMaps(localvol.Namespace).Delete(ctx, sharedvol.Lease, metav1.DeleteOptions{})
	})
	got, err := cms.Get(ctx, sharedvol.Lease, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node-a reading the provisioner's election record: %v", err)
	}
	got.Annotations = map[string]string{"control-plane.alpha.kubernetes.io/leader": `{"holderIdentity":"node-a"}`}
	if _, err := cms.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("node-a renewing the election record: %v", err)
	}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "another-record"}}
	if _, err := admin.CoreV1().ConfigMaps(localvol.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().ConfigMaps(localvol.Namespace).Delete(ctx, other.Name, metav1.DeleteOptions{}) })
	if _, err := cms.Get(ctx, other.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a reading another ConfigMap in %s: %v, want Forbidden", localvol.Namespace, err)
	}
}

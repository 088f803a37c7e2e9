package localpv

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/localvol"
)

// The provisioner against a real control plane (etcd, apiserver, controller-manager,
// scheduler, as `controlplane-bootstrap init` starts them, with the local-volume
// objects it applies), authenticating as a node does, so RBAC and the admission
// policy judge its real requests. No kubelet: the test sets the scheduler's
// selected-node annotation itself, and the disks are temporary directories with the
// recording quota stand-in (store_test.go).
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// diskDir is a directory standing for a mounted data disk, under the mount root the
// admission policy holds a node's volumes to, removed at the end.
func diskDir(t *testing.T) string {
	t.Helper()
	if err := os.MkdirAll(localvol.MountRoot, 0o755); err != nil {
		t.Fatalf("the data-disk mount root (this test runs as root, as CI does): %v", err)
	}
	dir, err := os.MkdirTemp(localvol.MountRoot, "test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func claim(name, class, size, node string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}},
	}
	if node != "" {
		c.Annotations = map[string]string{localvol.AnnSelectedNode: node}
	}
	return c
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestProvisionerInCluster: node-a's provisioner publishes its capacity, provisions a
// claim placed on it (bound by the controller-manager), leaves node-b's claim alone,
// says when a claim fits nowhere and when a class has a typo, and deletes the volume
// with its claim.
func TestProvisionerInCluster(t *testing.T) {
	c := testcluster.Shared(t)
	admin, err := kubernetes.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	store, quotas := newStore(t, diskDir(t), diskDir(t))
	errs := make(chan error, 1)
	go func() {
		errs <- Run(ctx, c.NodeClientset(t, "node-a"), "node-a", store, slog.New(slog.DiscardHandler), func(_ []DiskSpace, err error) {
			if err != nil {
				t.Logf("publish: %v", err)
			}
		})
	}()
	capName := localvol.StorageClass + ".node-a"
	waitUntil(t, "node-a's capacity", func() bool {
		o, err := admin.StorageV1().CSIStorageCapacities(localvol.Namespace).Get(ctx, capName, metav1.GetOptions{})
		return err == nil && o.MaximumVolumeSize != nil && o.MaximumVolumeSize.Value() > 0 && o.NodeTopology.MatchLabels[localvol.TopologyKey] == "node-a"
	})
	pvcs := admin.CoreV1().PersistentVolumeClaims("default")
	for _, cl := range []*corev1.PersistentVolumeClaim{claim("mine", localvol.StorageClass, "10Mi", "node-a"), claim("theirs", localvol.StorageClass, "10Mi", "node-b"),
		claim("huge", localvol.StorageClass, "1Pi", "")} {
		if _, err := pvcs.Create(ctx, cl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var pv *corev1.PersistentVolume
	waitUntil(t, "claim mine bound", func() bool {
		cl, err := pvcs.Get(ctx, "mine", metav1.GetOptions{})
		if err != nil || cl.Status.Phase != corev1.ClaimBound {
			return false
		}
		pv, err = admin.CoreV1().PersistentVolumes().Get(ctx, cl.Spec.VolumeName, metav1.GetOptions{})
		return err == nil
	})
	v, ok, err := store.Lookup(pv.Name)
	if !ok || err != nil || pv.Spec.Local.Path != v.Path || quotas.limits[v.Project] != 10<<20 || pv.Labels[localvol.LabelNode] != "node-a" {
		t.Errorf("volume %s: path %s, store %+v %v %v, limits %v, labels %v", pv.Name, pv.Spec.Local.Path, v, ok, err, quotas.limits, pv.Labels)
	}
	checkEvents(t, ctx, admin)
	if cl, _ := pvcs.Get(ctx, "theirs", metav1.GetOptions{}); cl.Spec.VolumeName != "" {
		t.Errorf("node-a provisioned node-b's claim: %s", cl.Spec.VolumeName)
	}
	if err := pvcs.Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "volume "+pv.Name+" deleted with its claim", func() bool {
		_, err := admin.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		_, ok, _ := store.Lookup(pv.Name)
		_, statErr := os.Stat(v.Path)
		return err != nil && !ok && statErr != nil
	})
	cancel()
	if err := <-errs; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// checkEvents: the 1Pi claim gets node-a's NoNodeHasRoom, and a claim of a class with a
// misspelt parameter a ProvisioningFailed naming it.
func checkEvents(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	typo := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "typo"}, Provisioner: localvol.Provisioner,
		VolumeBindingMode: &wffc, Parameters: map[string]string{"directoryMod": "0750"}}
	if _, err := admin.StorageV1().StorageClasses().Create(ctx, typo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, claim("typo", "typo", "1Mi", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"huge": "the largest free space on any node's data disks is", "typo": `unknown parameter "directoryMod"`} {
		waitUntil(t, "an event on claim "+name+" saying "+want, func() bool {
			l, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return false
			}
			for _, e := range l.Items {
				if strings.Contains(e.Message, want) {
					t.Logf("claim %s: %s: %s", name, e.Reason, e.Message)
					return true
				}
			}
			return false
		})
	}
}

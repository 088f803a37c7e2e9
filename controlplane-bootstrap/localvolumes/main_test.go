package localvolumes_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/localvolumes"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/localvol"
)

// One control plane, started by controlplane.Init as `controlplane-bootstrap init`
// does (which applies localvolumes.Objects and waits for the policy), serves every
// test here; TestMain stops it.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// testNFS is the shared test cluster's NFS export (testcluster.Config).
var testNFS = &testcluster.TestNFS

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// impersonate returns a client for user in groups, through the admin credential.
func impersonate(t *testing.T, c *testcluster.Cluster, user string, groups ...string) kubernetes.Interface {
	return c.Impersonate(t, user, groups...)
}

// nodeClient authenticates as node's kubelet does, once the policy is enforced.
func nodeClient(t *testing.T, c *testcluster.Cluster, node string) kubernetes.Interface {
	return c.NodeClientset(t, node)
}

// localPV is a volume as node's agent provisions it: annotated, labelled, under
// the mount root, with node affinity to node.
func localPV(name, node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{localvol.LabelNode: node},
			Annotations: map[string]string{localvol.AnnProvisionedBy: localvol.Provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              localvol.StorageClass,
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{
				Path: localvol.MountRoot + "/0fc63daf-8483-4772-8e79-3d69d8477de4/" + localvol.VolumesDir + "/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: localvol.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
}

// wantPolicyRefusal fails t unless err is the policy's refusal and mentions every
// one of words.
func wantPolicyRefusal(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want the admission policy %s to refuse it", what, localvolumes.Policy)
		return
	}
	if !strings.Contains(err.Error(), localvolumes.Policy) {
		t.Errorf("%s: %v, want the admission policy %s's refusal", what, err, localvolumes.Policy)
		return
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

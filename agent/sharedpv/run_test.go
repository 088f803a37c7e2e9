package sharedpv

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// The election and the provisioner against a real control plane (etcd, apiserver,
// controller-manager, scheduler, as `controlplane-bootstrap init` starts them, with
// the gpurack-shared class of testcluster.TestNFS and the RBAC and admission policy
// it applies), as two nodes' agents authenticating as their nodes. The export is a
// temporary directory (dirMounts): the directory work is Export's, the NFS mount
// TestRack's.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// dirMounts stands in for mount.nfs: every export is one temporary directory.
type dirMounts struct {
	dir string
	mu  sync.Mutex
	n   int
}

func (d *dirMounts) Mount(_ context.Context, server, share string, _ []string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if server != testcluster.TestNFS.Server || share != testcluster.TestNFS.Share {
		return "", fmt.Errorf("mount %s:%s: not the test export", server, share)
	}
	d.n++
	return d.dir, nil
}

func (d *dirMounts) UnmountAll(*slog.Logger) {}

// agent is one node's Run, stopped by cancel.
type agent struct {
	node   string
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	status Status
}

func startAgent(t *testing.T, c *testcluster.Cluster, node string, mounts Mounts) *agent {
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{node: node, cancel: cancel, done: make(chan error, 1)}
	client := c.NodeClientset(t, node)
	go func() {
		a.done <- Run(ctx, client, Options{Node: node, Mounts: mounts, Log: slog.New(slog.DiscardHandler),
			Told:          func(s Status) { a.mu.Lock(); a.status = s; a.mu.Unlock() },
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond, ClassPoll: 500 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-a.done })
	return a
}

func (a *agent) leading() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.status.Leading }

func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
	}
}

func boundClaim(t *testing.T, cs kubernetes.Interface, ns, name string) *corev1.PersistentVolume {
	t.Helper()
	var pv *corev1.PersistentVolume
	waitFor(t, "claim "+ns+"/"+name+" Bound", 60*time.Second, func() bool {
		c, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || c.Status.Phase != corev1.ClaimBound {
			return false
		}
		pv, err = cs.CoreV1().PersistentVolumes().Get(context.Background(), c.Spec.VolumeName, metav1.GetOptions{})
		return err == nil
	})
	return pv
}

// TestElectedProvisioner: of two nodes' agents one leads; a ReadWriteMany claim gets
// its directory on the export and an nfs volume; a ReadOnlyMany view of it shows the
// same directory read-only and holds back its deletion; once the view is gone the
// volume's deletion archives the directory; when the leader stops, the other agent
// takes over and provisions the next claim.
func TestElectedProvisioner(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	ctx := context.Background()
	mounts := &dirMounts{dir: t.TempDir()}
	a, b := startAgent(t, c, "node-a", mounts), startAgent(t, c, "node-b", mounts)
	waitFor(t, "one agent leading", 30*time.Second, func() bool { return a.leading() != b.leading() })
	leader, other := a, b
	if b.leading() {
		leader, other = b, a
	}
	t.Logf("%s leads, %s stands by", leader.node, other.node)

	ns := "shared-test"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	claims := admin.CoreV1().PersistentVolumeClaims(ns)
	class := sharedvol.StorageClass
	data := sharedClaim(ns, "models", corev1.ReadWriteMany)
	data.Spec.StorageClassName = &class
	if _, err := claims.Create(ctx, data, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := boundClaim(t, admin, ns, "models")
	dir := sharedvol.DirName(ns, "models", pv.Name)
	if pv.Spec.NFS == nil || pv.Spec.NFS.Path != "/srv/gpurack/volumes/"+dir || pv.Spec.NFS.ReadOnly {
		t.Fatalf("volume %s: %+v", pv.Name, pv.Spec.NFS)
	}
	if err := os.WriteFile(filepath.Join(mounts.dir, "volumes", dir, "weights.bin"), []byte("w"), 0o644); err != nil {
		t.Fatalf("the volume's directory on the export: %v", err)
	}

	view := sharedClaim(ns, "models-ro", corev1.ReadOnlyMany)
	view.Spec.StorageClassName = &class
	view.Annotations = map[string]string{sharedvol.AnnViewOf: "models"}
	if _, err := claims.Create(ctx, view, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vpv := boundClaim(t, admin, ns, "models-ro")
	if vpv.Spec.NFS == nil || vpv.Spec.NFS.Path != pv.Spec.NFS.Path || !vpv.Spec.NFS.ReadOnly {
		t.Errorf("view %s: %+v; want %s read-only", vpv.Name, vpv.Spec.NFS, pv.Spec.NFS.Path)
	}

	if err := claims.Delete(ctx, "models", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the deletion is tried (and refused) meanwhile
	if _, err := os.Stat(filepath.Join(mounts.dir, "volumes", dir, "weights.bin")); err != nil {
		t.Errorf("with a view left, the volume's directory: %v; want it kept", err)
	}
	if err := claims.Delete(ctx, "models-ro", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "volume "+pv.Name+" deleted once its view is gone", 60*time.Second, func() bool {
		_, err := admin.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return err != nil
	})
	archived, _ := filepath.Glob(filepath.Join(mounts.dir, "archived", dir+".*", "weights.bin"))
	if len(archived) != 1 {
		t.Errorf("archived copies of %s: %v; want one", dir, archived)
	}

	leader.cancel()
	waitFor(t, other.node+" taking over", 30*time.Second, other.leading)
	next := sharedClaim(ns, "scratch", corev1.ReadWriteMany)
	next.Spec.StorageClassName = &class
	if _, err := claims.Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	npv := boundClaim(t, admin, ns, "scratch")
	if _, err := os.Stat(filepath.Join(mounts.dir, "volumes", sharedvol.DirName(ns, "scratch", npv.Name))); err != nil {
		t.Errorf("after the takeover, the new volume's directory: %v", err)
	}
}

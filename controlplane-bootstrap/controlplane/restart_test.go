package controlplane_test

import (
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// kill -9 of kube-apiserver and of etcd: the supervisor restarts each, and
// every object is still there.
func TestSupervisorRestartsKilledComponents(t *testing.T) {
	c := testcluster.Shared(t)
	cp := c.ControlPlane()
	cs := c.Clientset(t)
	ctx := ctxFor(t, 5*time.Minute)
	token := c.JoinToken(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survives-restart", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{components.APIServer, components.Etcd} {
		old := cp.Supervisor.PID(name)
		restarts := cp.Supervisor.Restarts(name)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %s (pid %d): %v", name, old, err)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for cp.Supervisor.Restarts(name) == restarts || cp.Supervisor.PID(name) == old {
			if time.Now().After(deadline) {
				t.Fatalf("%s was not restarted after kill -9", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%s: pid %d killed, restarted as pid %d", name, old, cp.Supervisor.PID(name))
		waitAllHealthy(t, c, 3*time.Minute)
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, cm.Name, metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Fatalf("ConfigMap after the restarts: %v %v", got, err)
	}
	id := token[:6]
	if _, err := cs.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{}); err != nil {
		t.Errorf("bootstrap token after the restarts: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, "kubeadm:node-autoapprove-bootstrap", metav1.GetOptions{}); err != nil {
		t.Errorf("join RBAC after the restarts: %v", err)
	}
	cs.CoreV1().ConfigMaps("default").Delete(ctx, cm.Name, metav1.DeleteOptions{})
}

func waitAllHealthy(t *testing.T, c *testcluster.Cluster, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		hs := c.ControlPlane().Probe(ctxFor(t, 10*time.Second))
		ok := true
		for _, h := range hs {
			ok = ok && h.OK
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("control plane not healthy after %s: %v", d, hs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

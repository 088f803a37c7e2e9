package nodecontrol_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/policy"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// rig is an enrollment service and node controller against a real control plane,
// acting with the enroller credential.
type rig struct {
	t       testing.TB
	admin   kubernetes.Interface
	cluster *nodecontrol.Cluster
	svc     *enroll.Service
	ctl     *nodecontrol.Controller
}

func newRig(t testing.TB) *rig {
	c := testcluster.Shared(t)
	cluster, err := nodecontrol.Load(c.EnrollerKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// The test's own client is not throttled (client-go's default 5 QPS would
	// dominate the latency measured below).
	adminCfg := c.RESTConfig(t)
	adminCfg.QPS, adminCfg.Burst = 1000, 1000
	admin, err := kubernetes.NewForConfig(adminCfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, admin: admin, cluster: cluster}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nodes := nodecontrol.NewQueue()
	r.svc, err = enroll.New(context.Background(), enroll.Config{
		Store: store, CA: ca, Cluster: cluster, Policy: policy.Policy{Mode: policy.Manual},
		Racks: map[string]enroll.Rack{"r1": {Name: "r1", GossipKey: make([]byte, 32)}}, DefaultRack: "r1", Log: log,
		OnChange: func(m *inventory.Machine) { nodes.Enqueue(m.NodeName) },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.ctl = nodecontrol.NewController(cluster, r.svc, nodecontrol.Options{Queue: nodes, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.ctl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// waitFor polls cond until it holds (generous timeout; no wall-time assertion).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func (r *rig) node(name string) *corev1.Node {
	n, err := r.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// createNode registers a Node the way kubelet does (registerWithTaints), with the
// agent's gpurack.io/gpu.count label that marks it gpurack-managed (the enroller may
// change only such Nodes).
func (r *rig) createNode(name string) {
	_, err := r.admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpurack.io/gpu.count": "1"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpurack.io/unvalidated", Effect: corev1.TaintEffectNoSchedule}}},
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
}

// setGPUHealthy writes the GPUHealthy condition as the agent does.
func (r *rig) setGPUHealthy(name string, healthy bool) {
	st := corev1.ConditionFalse
	reason := "XidFatal"
	if healthy {
		st, reason = corev1.ConditionTrue, "AllChecksPassed"
	}
	for {
		n := r.node(name)
		var conds []corev1.NodeCondition
		for _, c := range n.Status.Conditions {
			if c.Type != "GPUHealthy" {
				conds = append(conds, c)
			}
		}
		now := metav1.Now()
		n.Status.Conditions = append(conds, corev1.NodeCondition{Type: "GPUHealthy", Status: st, Reason: reason,
			LastHeartbeatTime: now, LastTransitionTime: now})
		_, err := r.admin.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			r.t.Fatal(err)
		}
		return
	}
}

// enrollMachine registers, approves and redeems a machine; it returns the bundle and
// the agent key.
func (r *rig) enrollMachine(i int) (*bootv1.JoinBundle, ed25519.PrivateKey, *machinev1.MachineIdentity) {
	ctx := context.Background()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	id := &machinev1.MachineIdentity{BootMac: fmt.Sprintf("52:54:00:cc:%02x:%02x", i>>8, i&255), Serial: fmt.Sprintf("NC-%d-%d", i, time.Now().UnixNano())}
	reg := func() *bootv1.RegisterResponse {
		req := &bootv1.RegisterRequest{Facts: &machinev1.MachineFacts{Identity: id, Ips: []string{"192.0.2.50"}}, PublicKey: key.Public().(ed25519.PublicKey)}
		bootv1.SignRequest(key, bootv1.EnrollmentService_Register_FullMethodName, req, time.Now())
		resp, err := r.svc.Register(ctx, req)
		if err != nil {
			r.t.Fatal(err)
		}
		return resp
	}
	reg()
	if _, err := r.svc.Approve(ctx, id.BootMac, enroll.ApproveOptions{Actor: "operator:test", Reason: "test", NodeName: fmt.Sprintf("nc-%d-%d", i, time.Now().UnixNano()%1e6)}); err != nil {
		r.t.Fatal(err)
	}
	resp := reg()
	req := &bootv1.GetJoinBundleRequest{Token: resp.Token, Signature: bootv1.SignJoinBundle(key, resp.Challenge, resp.Token)}
	bootv1.SignRequest(key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	b, err := r.svc.GetJoinBundle(ctx, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return b.Bundle, key, id
}

func (r *rig) report(key ed25519.PrivateKey, id *machinev1.MachineIdentity, pass bool) *bootv1.ReportCommissioningResponse {
	st := machinev1.CheckStatus_CHECK_STATUS_PASS
	if !pass {
		st = machinev1.CheckStatus_CHECK_STATUS_FAIL
	}
	req := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{Identity: id, Phase: machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING,
		Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: st}}}}
	bootv1.SignRequest(key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, time.Now())
	resp, err := r.svc.ReportCommissioning(context.Background(), req)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

func (r *rig) tokenSecret(id string) (*corev1.Secret, error) {
	return r.admin.CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+id, metav1.GetOptions{})
}

func TestBootstrapTokensWithEnrollerCredential(t *testing.T) {
	r := newRig(t)
	if r.cluster.Endpoint() == "" || len(r.cluster.CAPEM()) == 0 {
		t.Fatal("cluster endpoint or CA missing from the enroller kubeconfig")
	}
	id, tok, err := r.cluster.MintBootstrapToken(context.Background(), "gpu-r1-u01", 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`).MatchString(tok) || tok[:6] != id {
		t.Fatalf("token %q id %q", tok, id)
	}
	s, err := r.tokenSecret(id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != "bootstrap.kubernetes.io/token" || string(s.Data["usage-bootstrap-authentication"]) != "true" ||
		string(s.Data["usage-bootstrap-signing"]) != "true" || string(s.Data["auth-extra-groups"]) != nodecontrol.NodeTokenGroup {
		t.Fatalf("token secret %+v", s.Data)
	}
	exp, err := time.Parse(time.RFC3339, string(s.Data["expiration"]))
	if err != nil || time.Until(exp) > 15*time.Minute || time.Until(exp) < 14*time.Minute {
		t.Fatalf("expiration %q", s.Data["expiration"])
	}
	if err := r.cluster.DeleteBootstrapToken(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.tokenSecret(id); !apierrors.IsNotFound(err) {
		t.Fatalf("token secret still there: %v", err)
	}
	if err := r.cluster.DeleteBootstrapToken(context.Background(), id); err != nil {
		t.Fatalf("deleting a missing token: %v", err)
	}
	// The enroller may not read Secrets (its RBAC is create and delete only).
	if _, err := r.cluster.Client().CoreV1().Secrets("kube-system").List(context.Background(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("enroller listing Secrets: %v, want Forbidden", err)
	}
}

func TestNodeLifecycleAndTaints(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	b, key, id := r.enrollMachine(1)
	if b.BootstrapToken == "" || b.ApiServerEndpoint != r.cluster.Endpoint() || b.ClusterCaPem == "" {
		t.Fatalf("bundle without Kubernetes credentials: endpoint %q token %q", b.ApiServerEndpoint, b.BootstrapToken)
	}
	tokenID := b.BootstrapToken[:6]
	if _, err := r.tokenSecret(tokenID); err != nil {
		t.Fatalf("bootstrap token not in the cluster: %v", err)
	}
	// The Node registers: joining → commissioning, token deleted.
	r.createNode(b.NodeName)
	waitFor(t, "machine to reach commissioning", func() bool {
		st, _, _ := r.svc.StateByNode(ctx, b.NodeName)
		return st == inventory.Commissioning
	})
	waitFor(t, "bootstrap token deletion", func() bool {
		_, err := r.tokenSecret(tokenID)
		return apierrors.IsNotFound(err)
	})
	if !hasTaint(r.node(b.NodeName), "gpurack.io/unvalidated") {
		t.Fatal("unvalidated taint removed before commissioning passed")
	}
	// Failing report: quarantined, still unvalidated.
	if resp := r.report(key, id, false); resp.MachineState != bootv1.MachineState_MACHINE_STATE_QUARANTINED {
		t.Fatalf("failing report: %v", resp)
	}
	time.Sleep(200 * time.Millisecond)
	if !hasTaint(r.node(b.NodeName), "gpurack.io/unvalidated") {
		t.Fatal("quarantined node lost its unvalidated taint")
	}
	// Passing report: ready, taint removed.
	if resp := r.report(key, id, true); resp.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
		t.Fatalf("passing report: %v", resp)
	}
	waitFor(t, "unvalidated taint removal", func() bool { return !hasTaint(r.node(b.NodeName), "gpurack.io/unvalidated") })

	// The taint mirrors GPUHealthy: set while False, removed once True (the agent's
	// --clear-after is the hysteresis, decision 0205).
	r.setGPUHealthy(b.NodeName, false)
	waitFor(t, "gpu-unhealthy taint", func() bool { return hasTaint(r.node(b.NodeName), "gpurack.io/gpu-unhealthy") })
	r.setGPUHealthy(b.NodeName, true)
	waitFor(t, "gpu-unhealthy taint to clear", func() bool { return !hasTaint(r.node(b.NodeName), "gpurack.io/gpu-unhealthy") })

	// Decommission deletes the Node.
	if _, err := r.svc.Decommission(ctx, b.NodeName, "operator:test", "retired"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.admin.CoreV1().Nodes().Get(ctx, b.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Node still exists after decommission: %v", err)
	}
}

// BenchmarkConditionToTaint measures the time from writing GPUHealthy=False on a Node
// to the gpu-unhealthy taint being visible through the API (CONTRACTS §5 target: under
// 1 s). Each iteration flips the condition False (timed) and back True (untimed).
func BenchmarkConditionToTaint(b *testing.B) {
	r := newRig(b)
	bundle, key, id := r.enrollMachine(2)
	r.createNode(bundle.NodeName)
	waitFor(b, "commissioning", func() bool {
		st, _, _ := r.svc.StateByNode(context.Background(), bundle.NodeName)
		return st == inventory.Commissioning
	})
	r.report(key, id, true)
	w, err := r.admin.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=" + bundle.NodeName})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	waitTaint := func(want bool) {
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && hasTaint(n, "gpurack.io/gpu-unhealthy") == want {
				return
			}
		}
		b.Fatal("watch ended")
	}
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		r.setGPUHealthy(bundle.NodeName, false)
		waitTaint(true)
		total += time.Since(start)
		b.StopTimer()
		r.setGPUHealthy(bundle.NodeName, true)
		waitTaint(false)
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/condition-to-taint")
}

// TestTenantGPUQuotas: with the enroller credential, gpuboot reads each tenant's GPU
// quota summed over its namespaces (hard, and used as the quota controller counts it),
// leaving out quotas of another name, without a GPU limit or without a tenant.
func TestTenantGPUQuotas(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quota := func(ns, name, tenant string, gpus string) {
		t.Helper()
		if _, err := r.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
		q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		if tenant != "" {
			q.Labels = map[string]string{nodecontrol.TenantLabel: tenant}
		}
		q.Spec.Hard = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")}
		if gpus != "" {
			q.Spec.Hard[nodecontrol.QuotaGPU] = resource.MustParse(gpus)
		}
		if _, err := r.admin.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	quota("quota-vision", nodecontrol.TenantQuotaName, "vision", "8")
	quota("quota-vision-dev", nodecontrol.TenantQuotaName, "vision", "2")
	quota("quota-vision-dev", "gpurack-tier-training", "vision", "1") // a tier's quota: not the tenant's
	quota("quota-speech", nodecontrol.TenantQuotaName, "speech", "")  // no GPU limit
	quota("quota-other", nodecontrol.TenantQuotaName, "", "4")        // no tenant
	// A pod asking for 3 GPUs in vision's first namespace: quota admission counts it as
	// used (once the quota controller has recorded the quota's status, it admits pods).
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "quota-vision"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("3")}}}}}}
	for {
		_, err := r.admin.CoreV1().Pods("quota-vision").Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create a pod under the quota: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var got map[string]nodecontrol.GPUQuota
	for {
		var err error
		if got, err = r.cluster.TenantGPUQuotas(ctx); err != nil {
			t.Fatal(err)
		}
		if got["vision"].Used == 3 || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got["vision"] != (nodecontrol.GPUQuota{Hard: 10, Used: 3}) || len(got) != 1 {
		t.Fatalf("quotas %v, want vision only, 3 of 10 GPUs used", got)
	}
}

package server_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// TestServeWithCluster runs the real gpuboot binary with the enroller kubeconfig of a
// real control plane: the bundle carries a bootstrap token minted in the cluster, the
// Node registering moves the machine to commissioning and deletes the token, a passing
// report makes it ready and the node controller removes gpurack.io/unvalidated.
func TestServeWithCluster(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	in := newInstance(t, "cluster: {kubeconfig: "+c.EnrollerKubeconfig+"}\n")
	in.start()
	enrollc := in.enrollClient()
	a := newTestAgent(21)
	ctx := context.Background()
	if _, err := a.register(ctx, enrollc); err != nil {
		t.Fatal(err)
	}
	in.cli("machines", "approve", a.facts.Identity.BootMac, "--reason", "cluster test", "--node-name", "gpu-r1-cluster")
	r, err := a.register(ctx, enrollc)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		t.Fatalf("register: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(a.key, r.Challenge, r.Token)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	resp, err := enrollc.GetJoinBundle(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b := resp.Bundle
	if b.ApiServerEndpoint != c.Server || !strings.Contains(b.ClusterCaPem, "BEGIN CERTIFICATE") || len(b.BootstrapToken) != 23 {
		t.Fatalf("bundle: endpoint %q (want %q), token %q", b.ApiServerEndpoint, c.Server, b.BootstrapToken)
	}
	// gpuboot.yaml sets no pod subnet, DNS address or domain: the bundle carries the
	// cluster's, read from kube-system/kubeadm-config (decision 0672).
	cfg := c.ControlPlane().Config
	if b.GetPodNetwork().GetSubnet() != cfg.Networking.PodSubnet || !slices.Equal(b.ClusterDns, []string{clusterDNS(t, admin)}) || b.ClusterDomain != cfg.Networking.DNSDomain {
		t.Errorf("bundle: pod subnet %q, cluster DNS %q, domain %q; want the cluster's %q, [%s], %q",
			b.GetPodNetwork().GetSubnet(), b.ClusterDns, b.ClusterDomain, cfg.Networking.PodSubnet, clusterDNS(t, admin), cfg.Networking.DNSDomain)
	}
	secret := "bootstrap-token-" + b.BootstrapToken[:6]
	if _, err := admin.CoreV1().Secrets("kube-system").Get(ctx, secret, metav1.GetOptions{}); err != nil {
		t.Fatalf("bootstrap token secret: %v", err)
	}
	// kubelet registers the Node with the unvalidated taint and the agent's labels
	// (gpurack.io/gpu.count marks it gpurack-managed for the enroller's policy).
	_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: b.NodeName, Labels: map[string]string{"gpurack.io/gpu.count": "1"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpurack.io/unvalidated", Effect: corev1.TaintEffectNoSchedule}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), b.NodeName, metav1.DeleteOptions{}) })
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, in.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	poll("commissioning", func() bool { return strings.Contains(in.cli("machines", "show", b.NodeName), "commissioning") })
	poll("token deletion", func() bool {
		_, err := admin.CoreV1().Secrets("kube-system").Get(ctx, secret, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// The commissioning report, with mutual TLS would be the agent's way; signed here.
	rep := &bootv1.ReportCommissioningRequest{Report: passingChecklist(a)}
	bootv1.SignRequest(a.key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, rep, time.Now())
	rr, err := enrollc.ReportCommissioning(ctx, rep)
	if err != nil || rr.MachineState != bootv1.MachineState_MACHINE_STATE_READY {
		t.Fatalf("report: %v %v", rr, err)
	}
	poll("unvalidated taint removal", func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, b.NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, tt := range n.Spec.Taints {
			if tt.Key == "gpurack.io/unvalidated" {
				return false
			}
		}
		return true
	})
	// Decommission through the CLI deletes the Node.
	in.cli("machines", "decommission", b.NodeName, "--reason", "cluster test done")
	if _, err := admin.CoreV1().Nodes().Get(ctx, b.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Node after decommission: %v", err)
	}
	in.stop()
}

// clusterDNS is the ClusterIP of the kube-dns Service controlplane-bootstrap created.
func clusterDNS(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	svc, err := admin.CoreV1().Services(clusterdns.Namespace).Get(context.Background(), clusterdns.ServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// TestServeRefusesAContradictingOverride: gpuboot.yaml's pod subnet and DNS address
// that the real cluster contradicts stop `gpuboot serve` at start, with an error that
// names each setting and its line, its value, the cluster's value and where that came
// from; an override that agrees starts.
func TestServeRefusesAContradictingOverride(t *testing.T) {
	c := testcluster.Shared(t)
	cfg := c.ControlPlane().Config
	in := newInstance(t, "cluster:\n  kubeconfig: "+c.EnrollerKubeconfig+"\n  podNetwork: {subnet: 10.99.0.0/16}\n  dns: [10.96.0.53]\n")
	out, err := exec.Command(in.bin, "serve", "--config", in.cfg).CombinedOutput()
	if err == nil {
		t.Fatalf("gpuboot serve started with a contradicting pod subnet and DNS address:\n%s", out)
	}
	for _, want := range []string{
		"cluster.podNetwork.subnet: 10.99.0.0/16 contradicts the cluster's pod subnet " + cfg.Networking.PodSubnet + " (networking.podSubnet in kube-system/kubeadm-config)",
		"cluster.dns: [10.96.0.53] contradicts the cluster's DNS address " + clusterDNS(t, c.Clientset(t)) + " (the tenth address of networking.serviceSubnet " + cfg.Networking.ServiceSubnet + " in kube-system/kubeadm-config)",
		in.cfg + ":",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("gpuboot serve's error lacks %q:\n%s", want, out)
		}
	}

	agrees := newInstance(t, "cluster: {kubeconfig: "+c.EnrollerKubeconfig+", podNetwork: {subnet: "+cfg.Networking.PodSubnet+"}}\n")
	agrees.start()
	agrees.stop()
}

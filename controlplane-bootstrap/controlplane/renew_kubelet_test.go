package controlplane_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/hostnode"
)

// kubeletSigning is how long the controller-manager signs kubelet client certificates
// for in TestKubeletKeepsItsNodeAcrossRenewals: kubelet rotates its own at 70 to 90 %
// of that, within the test.
const kubeletSigning = 2 * time.Minute

// TestKubeletKeepsItsNodeAcrossRenewals: a real kubelet (hostnode) joined to a private
// control plane keeps its Node Ready and its Lease renewed across both renewals that
// touch it: `certs renew all`, which reissues the apiserver's serving certificate and
// restarts every component (kubelet trusts the CA, not the leaf), and kubelet's own
// client certificate, which the controller-manager signs for two minutes here and
// kubelet rotates through a CSR before it expires.
func TestKubeletKeepsItsNodeAcrossRenewals(t *testing.T) {
	hostnode.Require(t)
	c := testcluster.NewWith(t, testcluster.Options{Supervised: true, Configure: func(cfg *clusterconfig.Config) {
		cfg.ControllerManager.ExtraArgs = map[string]string{"cluster-signing-duration": kubeletSigning.String()}
	}})
	n := hostnode.Start(t, c, hostnode.Options{Name: "renewal-node"})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	n.WaitReady(t, ctx)
	cs := c.Clientset(t)
	first := kubeletClientCert(t, n)
	// The signer backdates NotBefore by five minutes; NotAfter is the signing duration on.
	if left := time.Until(first.NotAfter); left > kubeletSigning+30*time.Second {
		t.Fatalf("kubelet's client certificate has %s left, not the %s the controller-manager was given", left.Round(time.Second), kubeletSigning)
	}
	notReady := watchNodeReady(ctx, cs, n.Name)

	var out bytes.Buffer
	renewed := time.Now()
	if _, err := controlplane.RenewCertificates(ctx, c.Dir, controlplane.RenewOptions{Names: []string{clusterpki.RenewAll}, Out: &out}); err != nil {
		t.Fatalf("certs renew all: %v\n%s", err, out.String())
	}
	waitLeaseRenewedAfter(t, ctx, cs, n.Name, renewed, "after certs renew all restarted the apiserver on its new serving certificate")

	// kubelet's own rotation: a new client certificate before the first expires.
	var second *x509.Certificate
	for second == nil || second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		if time.Now().After(first.NotAfter) || ctx.Err() != nil {
			t.Fatalf("kubelet did not rotate its client certificate (serial %x) before it expired at %s\n%s", first.SerialNumber, first.NotAfter, n.Logs())
		}
		time.Sleep(2 * time.Second)
		second = kubeletClientCert(t, n)
	}
	rotated := time.Now()
	t.Logf("kubelet rotated its client certificate %s before it expired (signed for %s)", first.NotAfter.Sub(rotated).Round(time.Second), kubeletSigning)
	waitLeaseRenewedAfter(t, ctx, cs, n.Name, rotated, "with its rotated client certificate")
	waitLeaseRenewedAfter(t, ctx, cs, n.Name, first.NotAfter, "after its first client certificate expired")
	cancel()
	if d := <-notReady; d != "" {
		t.Errorf("Node %s was not Ready at some point: %s", n.Name, d)
	}
}

// kubeletClientCert is the certificate kubelet authenticates with now.
func kubeletClientCert(t *testing.T, n *hostnode.Node) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.Dir, "pki", "kubelet-client-current.pem"))
	if err != nil {
		t.Fatal(err)
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatal("kubelet-client-current.pem holds no certificate")
	return nil
}

// waitLeaseRenewedAfter waits until the node's Lease has been renewed after since.
func waitLeaseRenewedAfter(t *testing.T, ctx context.Context, cs kubernetes.Interface, node string, since time.Time, what string) {
	t.Helper()
	var l *coordinationv1.Lease
	for {
		var err error
		l, err = cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(since) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the Lease of %s was not renewed %s (since %s): %v %v", node, what, since.Format(time.TimeOnly), err, l)
		}
		time.Sleep(2 * time.Second)
	}
}

// watchNodeReady polls the Node every 2 s until ctx ends and then sends "" if it was
// Ready every time it could be read, or when and why it was not.
func watchNodeReady(ctx context.Context, cs kubernetes.Interface, name string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		bad := ""
		for ctx.Err() == nil {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err == nil && !hostnode.Ready(n) && bad == "" {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady {
						bad = time.Now().Format(time.TimeOnly) + ": " + string(c.Status) + " " + c.Reason + " " + c.Message
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
		ch <- bad
	}()
	return ch
}

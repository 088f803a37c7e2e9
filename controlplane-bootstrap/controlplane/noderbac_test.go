package controlplane_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// TestNodeIdentityReadsWhatNodeServicesNeed checks, against the real apiserver, the
// rule in docs/controlplane.md: a node's own identity (system:node:NAME in
// system:nodes, the kubelet's client certificate) may list and watch Nodes and
// EndpointSlices, which the pod network and kube-proxy need, and pods, namespaces and
// NetworkPolicies, which the NetworkPolicy enforcement needs, and gains no write:
// it cannot patch another node nor read a Secret.
func TestNodeIdentityReadsWhatNodeServicesNeed(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	nodeA, err := joinNode(t, c, token, "rbac-node-a")
	if err != nil {
		t.Fatalf("join node a: %v", err)
	}
	if _, err := joinNode(t, c, token, "rbac-node-b"); err != nil {
		t.Fatalf("join node b: %v", err)
	}
	ctx := ctxFor(t, time.Minute)

	// list/watch nodes (gpurack:node-reader): the other node is visible.
	nodes, err := nodeA.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("node a listing nodes: %v", err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "rbac-node-b") {
		t.Errorf("node a lists %v, without rbac-node-b", names)
	}
	w, err := nodeA.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: nodes.ResourceVersion})
	if err != nil {
		t.Fatalf("node a watching nodes: %v", err)
	}
	defer w.Stop()
	// The admin changes node b; node a's watch sees it.
	label := []byte(`{"metadata":{"labels":{"gpurack.io/rbac-test":"seen"}}}`)
	if _, err := c.Clientset(t).CoreV1().Nodes().Patch(ctx, "rbac-node-b", types.StrategicMergePatchType, label, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, w, func(ev watch.Event) bool {
		n, ok := ev.Object.(*corev1.Node)
		return ok && ev.Type == watch.Modified && n.Name == "rbac-node-b" && n.Labels["gpurack.io/rbac-test"] == "seen"
	}, "node a's watch to see node b change")

	// list/watch EndpointSlices (system:node-proxier), in every namespace.
	eps, err := nodeA.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("node a listing endpointslices: %v", err)
	}
	ew, err := nodeA.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{ResourceVersion: eps.ResourceVersion})
	if err != nil {
		t.Fatalf("node a watching endpointslices: %v", err)
	}
	defer ew.Stop()
	port, proto := int32(80), corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "rbac-test", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "rbac-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
	admin := c.Clientset(t)
	if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.DiscoveryV1().EndpointSlices("default").Delete(ctx, "rbac-test", metav1.DeleteOptions{}) })
	waitFor(t, ew, func(ev watch.Event) bool {
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		return ok && ev.Type == watch.Added && s.Name == "rbac-test"
	}, "node a's watch to see the new EndpointSlice")

	// list pods, namespaces and NetworkPolicies everywhere (gpurack:node-policy-reader),
	// for the NetworkPolicy enforcement; but not write one.
	if _, err := nodeA.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node a listing pods: %v", err)
	}
	if _, err := nodeA.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node a listing namespaces: %v", err)
	}
	if _, err := nodeA.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node a listing networkpolicies: %v", err)
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test", Namespace: "default"}}
	if _, err := nodeA.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node a creating a NetworkPolicy: %v, want Forbidden", err)
	}

	// No write beyond itself: NodeRestriction still refuses another node...
	_, err = nodeA.CoreV1().Nodes().Patch(ctx, "rbac-node-b", types.StrategicMergePatchType, label, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node a patching node b: %v, want Forbidden", err)
	}
	// ...and the read grants write nothing.
	if err := nodeA.DiscoveryV1().EndpointSlices("default").Delete(ctx, "rbac-test", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node a deleting an EndpointSlice: %v, want Forbidden", err)
	}

	// No Secret: neither one by name nor a list.
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test", Namespace: "default"}, StringData: map[string]string{"k": "v"}}
	if _, err := admin.CoreV1().Secrets("default").Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Secrets("default").Delete(ctx, "rbac-test", metav1.DeleteOptions{}) })
	if _, err := nodeA.CoreV1().Secrets("default").Get(ctx, "rbac-test", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node a reading a Secret: %v, want Forbidden", err)
	}
	if _, err := nodeA.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node a listing Secrets: %v, want Forbidden", err)
	}
}

// waitFor reads w until match accepts an event; it fails the test after 30 s.
func waitFor(t *testing.T, w watch.Interface, match func(watch.Event) bool, what string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("waiting for %s: the watch closed", what)
			}
			if match(ev) {
				return
			}
		case <-timeout:
			t.Fatalf("waiting for %s: nothing in 30 s", what)
		}
	}
}

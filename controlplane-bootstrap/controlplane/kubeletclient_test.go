package controlplane_test

import (
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// TestAPIServerKubeletClientMayUseKubeletAPI asks the apiserver, with the apiserver's
// own client certificate for kubelets (the identity a kubelet sees on `kubectl logs`
// and `exec` and checks through a SubjectAccessReview), what that identity may do:
// the kubelet API (nodes/proxy, nodes/log, nodes/stats) yes; anything else no.
// Without the gpurack:apiserver-kubelet-client binding `kubectl logs` on a node was
// Forbidden.
func TestAPIServerKubeletClientMayUseKubeletAPI(t *testing.T) {
	c := testcluster.Shared(t)
	layout := components.Layout{Dir: c.Dir}
	cfg := rest.CopyConfig(c.RESTConfig(t))
	cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData = nil, nil
	cfg.TLSClientConfig.CertFile = layout.PKI(clusterpki.APIServerKubeletCert)
	cfg.TLSClientConfig.KeyFile = layout.PKI(clusterpki.APIServerKubeletKey)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, time.Minute)
	for _, tc := range []struct {
		verb, resource, sub string
		want                bool
	}{
		{"get", "nodes", "proxy", true},
		{"create", "nodes", "proxy", true}, // exec and port-forward
		{"get", "nodes", "log", true},
		{"get", "nodes", "stats", true},
		{"delete", "nodes", "", false},
		{"get", "secrets", "", false},
		{"create", "pods", "", false},
	} {
		review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: tc.verb, Resource: tc.resource, Subresource: tc.sub}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject access review as %s: %v", clusterpki.APIServerKubeletUser, err)
		}
		if review.Status.Allowed != tc.want {
			t.Errorf("%s may %s %s/%s: %v, want %v (%s)", clusterpki.APIServerKubeletUser, tc.verb, tc.resource, tc.sub,
				review.Status.Allowed, tc.want, review.Status.Reason)
		}
	}
}

package controlplane

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// A cut of Kueue's config/components/webhook/manifests.yaml: one of its own kinds, a
// Job's, and a Pod's, which init must leave out.
const sampleWebhooks = `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-clusterqueue}
  failurePolicy: Fail
  name: vclusterqueue.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE, UPDATE], resources: [clusterqueues]}
  sideEffects: None
`

// TestKueueWebhooksPointAtTheHost: each kept webhook calls 127.0.0.1 on the configured
// port with the cluster CA; the Pod webhook is left out; the Job webhook sees only Jobs
// that name a LocalQueue.
func TestKueueWebhooksPointAtTheHost(t *testing.T) {
	docs, err := ParseManifests([]byte(sampleWebhooks))
	if err != nil || len(docs) != 2 {
		t.Fatalf("ParseManifests: %d docs, %v", len(docs), err)
	}
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	m := &kueueManifests{role: &unstructured.Unstructured{Object: map[string]any{"kind": "ClusterRole", "metadata": map[string]any{"name": "manager-role"}, "rules": []any{}}}, webhooks: docs}
	objs, err := m.objects("https://127.0.0.1:9443", ca)
	if err != nil {
		t.Fatal(err)
	}
	var hooks []map[string]any
	for _, o := range objs {
		u, ok := o.Obj.(*unstructured.Unstructured)
		if !ok {
			continue // the ClusterRoleBinding, typed
		}
		if strings.HasSuffix(u.GetKind(), "WebhookConfiguration") {
			ws, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
			for _, w := range ws {
				hooks = append(hooks, w.(map[string]any))
			}
		}
		if u.GetKind() == "ClusterRole" && u.GetName() != KueueRole {
			t.Errorf("ClusterRole named %s, want %s", u.GetName(), KueueRole)
		}
	}
	if len(hooks) != 2 {
		t.Fatalf("%d webhooks kept, want 2 (the Job's and the ClusterQueue's): %v", len(hooks), hooks)
	}
	for _, h := range hooks {
		url, _, _ := unstructured.NestedString(h, "clientConfig", "url")
		bundle, _, _ := unstructured.NestedString(h, "clientConfig", "caBundle")
		if !strings.HasPrefix(url, "https://127.0.0.1:9443/") || bundle != base64.StdEncoding.EncodeToString(ca) {
			t.Errorf("webhook %v calls %q with caBundle %q", h["name"], url, bundle)
		}
		_, hasSel := h["objectSelector"]
		if (h["name"] == "mjob.kb.io") != hasSel {
			t.Errorf("webhook %v: objectSelector %v", h["name"], h["objectSelector"])
		}
	}
}

// TestKueueManifestsFromTheBuild reads what `make k8s-bins` copied beside the binary,
// when it is there: the CRDs, the role and webhooks that keep at least the Job's.
func TestKueueManifestsFromTheBuild(t *testing.T) {
	dir := filepath.Join(components.BinDir(""), components.KueueManifestsDir)
	if _, err := os.Stat(dir); err != nil {
		t.Logf("%s absent (make k8s-bins): the sample above stands in", dir)
		return
	}
	cfg := clusterconfig.Default()
	cfg.Queues.Enabled = true
	m, err := readKueueManifests(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := m.objects("https://127.0.0.1:9443", []byte("ca"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.crds) < 5 || len(objs) < len(m.crds)+4 {
		t.Errorf("%d CRDs, %d objects", len(m.crds), len(objs))
	}
}

// FuzzParseManifests: any bytes, no panic; every object returned has an apiVersion, a
// kind and a name.
func FuzzParseManifests(f *testing.F) {
	for _, s := range []string{sampleWebhooks, "", "---\n---\n", "kind: X\n", "a: [", "{\"apiVersion\":\"v1\",\"kind\":\"A\",\"metadata\":{\"name\":\"n\"}}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := ParseManifests(data)
		if err != nil {
			return
		}
		for _, d := range docs {
			if d.GetAPIVersion() == "" || d.GetKind() == "" || d.GetName() == "" {
				t.Fatalf("accepted %v", d.Object)
			}
		}
	})
}

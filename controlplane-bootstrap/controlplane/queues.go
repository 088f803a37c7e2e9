package controlplane

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

// KueueRole is Kueue's ClusterRole and ClusterRoleBinding (to clusterpki.KueueUser):
// the manager role of its module's config/components/rbac/role.yaml, renamed, and the
// token and access reviews its metrics server's authorization makes
// (metrics_auth_role.yaml).
const KueueRole = "gpurack:kueue"

// The names init gives Kueue's webhook configurations.
const (
	KueueMutatingWebhooks   = "gpurack-kueue-mutating"
	KueueValidatingWebhooks = "gpurack-kueue-validating"
	// kueueQueueLabel is the label a Job names its LocalQueue with.
	kueueQueueLabel = "kueue.x-k8s.io/queue-name"
)

var (
	gvrCRD                = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	gvrMutatingWebhooks   = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
	gvrValidatingWebhooks = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
)

// kueueWebhookGroups are the API groups whose webhooks are kept: Kueue's own kinds and
// Jobs (the one integration on). The others (pods, deployments, other frameworks' kinds)
// are left out, so that Kueue being down never refuses a Pod or a Deployment.
var kueueWebhookGroups = []string{"kueue.x-k8s.io", "batch"}

// kueueManifests are Kueue's objects as its module ships them (k8s-bins copies them to
// bin/kueue-manifests), read before anything is written so that a missing file stops
// init with nothing changed.
type kueueManifests struct {
	crds     []*unstructured.Unstructured
	role     *unstructured.Unstructured
	webhooks []*unstructured.Unstructured
}

// readKueueManifests reads them from the pinned binaries' folder.
func readKueueManifests(cfg *clusterconfig.Config) (*kueueManifests, error) {
	if !cfg.Queues.Enabled {
		return nil, nil
	}
	dir := filepath.Join(components.BinDir(cfg.BinDir), components.KueueManifestsDir)
	hint := " (run `make k8s-bins`, which copies Kueue's manifests beside its binary)"
	crdFiles, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err == nil && len(crdFiles) == 0 {
		err = fmt.Errorf("no CRDs in %s", filepath.Join(dir, "crds"))
	}
	if err != nil {
		return nil, fmt.Errorf("queues: %w%s", err, hint)
	}
	m := &kueueManifests{}
	for _, f := range crdFiles {
		docs, err := readManifestFile(f)
		if err != nil {
			return nil, fmt.Errorf("queues: %w%s", err, hint)
		}
		m.crds = append(m.crds, docs...)
	}
	roles, err := readManifestFile(filepath.Join(dir, "role.yaml"))
	if err != nil {
		return nil, fmt.Errorf("queues: %w%s", err, hint)
	}
	if len(roles) != 1 || roles[0].GetKind() != "ClusterRole" {
		return nil, fmt.Errorf("queues: %s holds no single ClusterRole%s", filepath.Join(dir, "role.yaml"), hint)
	}
	m.role = roles[0]
	if m.webhooks, err = readManifestFile(filepath.Join(dir, "webhooks.yaml")); err != nil {
		return nil, fmt.Errorf("queues: %w%s", err, hint)
	}
	return m, nil
}

// readManifestFile reads the YAML documents of path.
func readManifestFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	docs, err := ParseManifests(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return docs, nil
}

// ParseManifests splits a YAML stream into its objects; empty documents are skipped, and
// a document without apiVersion, kind or metadata.name is an error.
func ParseManifests(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("document %d has no apiVersion, kind or metadata.name", i+1)
		}
		out = append(out, u)
	}
}

// objects are what init applies for Kueue: its CRDs, its ClusterRole and binding, and
// its webhook configurations pointed at url with the cluster CA as their caBundle.
func (m *kueueManifests) objects(url string, caPEM []byte) ([]joinconfig.Object, error) {
	if m == nil {
		return nil, nil
	}
	var objs []joinconfig.Object
	for _, c := range m.crds {
		objs = append(objs, joinconfig.Object{GVR: gvrCRD, Obj: c.DeepCopy()})
	}
	role := m.role.DeepCopy()
	role.SetName(KueueRole)
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	rules = append(rules,
		map[string]any{"apiGroups": []any{"authentication.k8s.io"}, "resources": []any{"tokenreviews"}, "verbs": []any{"create"}},
		map[string]any{"apiGroups": []any{"authorization.k8s.io"}, "resources": []any{"subjectaccessreviews"}, "verbs": []any{"create"}})
	if err := unstructured.SetNestedSlice(role.Object, rules, "rules"); err != nil {
		return nil, err
	}
	objs = append(objs, joinconfig.Object{GVR: gvrClusterRole, Obj: role},
		joinconfig.ClusterRoleBinding(KueueRole, KueueRole, joinconfig.User(clusterpki.KueueUser)))
	for _, w := range m.webhooks {
		o, err := webhookConfiguration(w, url, caPEM)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o)
	}
	return objs, nil
}

var gvrClusterRole = rbacv1.SchemeGroupVersion.WithResource("clusterroles")

// webhookConfiguration rewrites one of Kueue's webhook configurations for this host:
// each webhook calls url+path (the apiserver reaches Kueue on 127.0.0.1, not through a
// Service) and trusts caPEM; only the webhooks of kueueWebhookGroups are kept; a Job's
// webhooks see only Jobs that name a LocalQueue.
func webhookConfiguration(w *unstructured.Unstructured, url string, caPEM []byte) (joinconfig.Object, error) {
	out := w.DeepCopy()
	var gvr schema.GroupVersionResource
	switch w.GetKind() {
	case "MutatingWebhookConfiguration":
		gvr = gvrMutatingWebhooks
		out.SetName(KueueMutatingWebhooks)
	case "ValidatingWebhookConfiguration":
		gvr = gvrValidatingWebhooks
		out.SetName(KueueValidatingWebhooks)
	default:
		return joinconfig.Object{}, fmt.Errorf("queues: webhooks.yaml: unexpected %s %s", w.GetKind(), w.GetName())
	}
	hooks, _, _ := unstructured.NestedSlice(w.Object, "webhooks")
	var kept []any
	for _, h := range hooks {
		hook, ok := h.(map[string]any)
		if !ok {
			return joinconfig.Object{}, fmt.Errorf("queues: webhooks.yaml: a webhook of %s is not an object", w.GetName())
		}
		groups := webhookGroups(hook)
		if len(groups) == 0 || slices.ContainsFunc(groups, func(g string) bool { return !slices.Contains(kueueWebhookGroups, g) }) {
			continue
		}
		path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
		if path == "" {
			return joinconfig.Object{}, fmt.Errorf("queues: webhooks.yaml: webhook %v has no service path", hook["name"])
		}
		hook["clientConfig"] = map[string]any{"url": url + path, "caBundle": caBundle(caPEM)}
		if slices.Contains(groups, "batch") {
			hook["objectSelector"] = map[string]any{"matchExpressions": []any{
				map[string]any{"key": kueueQueueLabel, "operator": "Exists"},
			}}
		}
		kept = append(kept, hook)
	}
	if len(kept) == 0 {
		return joinconfig.Object{}, fmt.Errorf("queues: webhooks.yaml: %s has no webhook for %s", w.GetName(), strings.Join(kueueWebhookGroups, ", "))
	}
	if err := unstructured.SetNestedSlice(out.Object, kept, "webhooks"); err != nil {
		return joinconfig.Object{}, err
	}
	return joinconfig.Object{GVR: gvr, Obj: out}, nil
}

// webhookGroups are the API groups a webhook's rules name.
func webhookGroups(hook map[string]any) []string {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	var groups []string
	for _, r := range rules {
		rm, ok := r.(map[string]any)
		if !ok {
			continue
		}
		gs, _, _ := unstructured.NestedStringSlice(rm, "apiGroups")
		groups = append(groups, gs...)
	}
	return groups
}

// caBundle is caPEM as a JSON []byte field is written (base64).
func caBundle(caPEM []byte) string {
	return base64.StdEncoding.EncodeToString(caPEM)
}

// writeQueueFiles writes DIR/queues/kueue-config.yaml.
func writeQueueFiles(l components.Layout, cfg *clusterconfig.Config) error {
	if !cfg.Queues.Enabled {
		return nil
	}
	data, err := components.KueueConfig(cfg, l)
	if err != nil {
		return err
	}
	return atomicfile.WriteMkdirAll(l.KueueConfig(), data, 0o644, 0o755)
}

// applyKueue applies Kueue's objects before it starts, retrying while the apiserver
// finishes its own bootstrap, and waits until its CRDs are established: Kueue's caches
// need them when it starts.
func (cp *ControlPlane) applyKueue(ctx context.Context) error {
	m, err := readKueueManifests(cp.Config)
	if err != nil || m == nil {
		return err
	}
	objs, err := m.objects(components.KueueWebhookURL(cp.Config), cp.PKI.CACertPEM())
	if err != nil {
		return err
	}
	cfg, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	err = applyRetrying(ctx, dyn, objs)
	if err != nil {
		return fmt.Errorf("apply Kueue's CRDs, role and webhooks: %w", err)
	}
	for _, c := range m.crds {
		if err := waitEstablished(ctx, dyn, c.GetName()); err != nil {
			return err
		}
	}
	return nil
}

// waitEstablished waits, up to a minute, until the CRD name is Established.
func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		u, err := dyn.Resource(gvrCRD).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if cm, ok := c.(map[string]any); ok && cm["type"] == "Established" && cm["status"] == "True" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("CRD %s not established after a minute (last error: %v)", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// beforeStart does what component c needs done in the cluster before it starts (for a
// systemd unit, before it can become healthy): Kueue's CRDs, role and webhooks, and,
// when the metrics server runs, the token it scrapes Kueue's /metrics with.
func (cp *ControlPlane) beforeStart(ctx context.Context, c components.Component) error {
	if c.Name != components.Kueue {
		return nil
	}
	if err := cp.applyKueue(ctx); err != nil {
		return err
	}
	if !cp.Config.Monitoring.Enabled {
		return nil
	}
	return cp.writeScrapeToken(ctx)
}

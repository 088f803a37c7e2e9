package joinconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

func metaOf(obj runtime.Object) (metav1.Object, error) { return meta.Accessor(obj) }

// Apply applies each object with server-side apply under FieldManager,
// forcing ownership of the fields it sets. Fields others set (the
// bootstrapsigner's JWS keys in cluster-info) are left alone.
func Apply(ctx context.Context, client dynamic.Interface, objs []Object) error {
	for _, o := range objs {
		m, err := metaOf(o.Obj)
		if err != nil {
			return err
		}
		body, err := json.Marshal(o.Obj)
		if err != nil {
			return fmt.Errorf("apply %s: %w", o.Name(), err)
		}
		force := true
		var ri dynamic.ResourceInterface = client.Resource(o.GVR)
		if ns := m.GetNamespace(); ns != "" {
			ri = client.Resource(o.GVR).Namespace(ns)
		}
		if _, err := ri.Patch(ctx, m.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
			return fmt.Errorf("apply %s: %w", o.Name(), err)
		}
	}
	return nil
}

// WaitEnrollerPolicy waits until the apiserver enforces EnrollerPolicy: a
// dry-run create of an Opaque Secret, impersonating the enroller, is
// refused. The admission plugin loads new policies asynchronously, so
// without this wait a just-started cluster would briefly admit anything the
// enroller's RBAC allows.
func WaitEnrollerPolicy(ctx context.Context, admin *rest.Config) error {
	probe := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "gpurack-enroller-policy-probe"},
		Type:       corev1.SecretTypeOpaque,
	}
	as := rest.ImpersonationConfig{UserName: EnrollerUser, Groups: []string{EnrollerGroup, "system:authenticated"}}
	return WaitPolicy(ctx, admin, EnrollerPolicy, as, func(ctx context.Context, c kubernetes.Interface, dryRun metav1.CreateOptions) error {
		_, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, probe, dryRun)
		return err
	})
}

// WaitPolicy waits, up to a minute, until the apiserver enforces the
// ValidatingAdmissionPolicy named policy: until create, a dry-run create made as
// the impersonated user that the policy must refuse, fails naming it. The
// admission plugin loads a new policy asynchronously; without this wait a
// just-started cluster would briefly admit what the policy is there to refuse.
func WaitPolicy(ctx context.Context, admin *rest.Config, policy string, as rest.ImpersonationConfig,
	create func(ctx context.Context, c kubernetes.Interface, dryRun metav1.CreateOptions) error) error {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = as
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		last = create(ctx, client, dryRun)
		return last != nil && strings.Contains(last.Error(), policy), nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver does not enforce the admission policy %s yet (last answer: %v)", policy, last)
	}
	return nil
}

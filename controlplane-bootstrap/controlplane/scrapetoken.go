package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

// The metrics server's bearer token, for the /metrics endpoints that authenticate only
// tokens (Kueue's: controller-runtime's filter reviews a token and takes no client
// certificate). It belongs to ServiceAccount kube-system/scrapeTokenAccount, bound to
// monitoringRole (get /metrics, nothing that changes anything), and lives in a
// service-account-token Secret the controller-manager fills; init copies it to
// components.Layout.ScrapeTokenFile, which Prometheus reads at every scrape.
const (
	scrapeTokenAccount = "gpurack-metrics-scraper"
	scrapeTokenSecret  = "gpurack-metrics-scraper-token"
)

// scrapeTokenObjects are the ServiceAccount, its binding to monitoringRole and the
// token Secret.
func scrapeTokenObjects() []joinconfig.Object {
	return []joinconfig.Object{
		{GVR: corev1.SchemeGroupVersion.WithResource("serviceaccounts"), Obj: &corev1.ServiceAccount{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: scrapeTokenAccount},
		}},
		joinconfig.ClusterRoleBinding(monitoringRole+"-token", monitoringRole, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: metav1.NamespaceSystem, Name: scrapeTokenAccount}),
		{GVR: corev1.SchemeGroupVersion.WithResource("secrets"), Obj: &corev1.Secret{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: scrapeTokenSecret,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: scrapeTokenAccount}},
			Type: corev1.SecretTypeServiceAccountToken,
		}},
	}
}

// writeScrapeToken applies scrapeTokenObjects, waits (up to two minutes: the
// controller-manager fills the Secret once it leads) for the token and writes it to
// the token file, readable by its owner only.
func (cp *ControlPlane) writeScrapeToken(ctx context.Context) error {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := applyRetrying(ctx, dyn, scrapeTokenObjects()); err != nil {
		return fmt.Errorf("apply the metrics server's ServiceAccount and token Secret: %w", err)
	}
	token, err := waitServiceAccountToken(ctx, cs, metav1.NamespaceSystem, scrapeTokenSecret, 2*time.Minute)
	if err != nil {
		return err
	}
	return atomicfile.Write(cp.Layout.ScrapeTokenFile(), token, 0o600)
}

// waitServiceAccountToken waits until Secret ns/name holds a token.
func waitServiceAccountToken(ctx context.Context, cs kubernetes.Interface, ns, name string, limit time.Duration) ([]byte, error) {
	deadline := time.Now().Add(limit)
	for {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Data[corev1.ServiceAccountTokenKey]) > 0 {
			return s.Data[corev1.ServiceAccountTokenKey], nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("secret %s/%s has no token after %s (the controller-manager's token controller fills it: is kube-controller-manager running? its log is in the components' log folder); last error: %v",
				ns, name, limit, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

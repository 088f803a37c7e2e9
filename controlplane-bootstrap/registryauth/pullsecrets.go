package registryauth

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
)

// The pull Secret in each tenant namespace, and who manages it.
const (
	PullSecretName = "gpurack-registry"
	// ManagedBy is the app.kubernetes.io/managed-by value of the pull Secrets. It is
	// not tenants.ManagedBy: `tenants apply` prunes what carries that.
	ManagedBy = "gpurack-registry-auth"
	// ServiceAccount is the account whose imagePullSecrets name the pull Secret, so
	// that a pod that names no account pulls from the registry unasked.
	ServiceAccount = "default"
)

// TenantNamespaces lists, by tenant, the namespaces `tenants apply` made and that are
// not being deleted.
func TenantNamespaces(ctx context.Context, client kubernetes.Interface) (map[string][]string, error) {
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{
		LabelSelector: tenants.LabelManagedBy + "=" + tenants.ManagedBy + "," + tenants.LabelTenant,
	})
	if err != nil {
		return nil, fmt.Errorf("list the tenants' namespaces: %w", err)
	}
	out := map[string][]string{}
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			t := ns.Labels[tenants.LabelTenant]
			out[t] = append(out[t], ns.Name)
		}
	}
	for _, nss := range out {
		sort.Strings(nss)
	}
	return out, nil
}

// PullSecretResult is what ApplyPullSecrets did.
type PullSecretResult struct {
	// Issued are the tenants given a new pull credential; Removed those whose
	// credential was deleted (no longer tenants).
	Issued, Removed []string
	// Written are the namespace/name of Secrets and ServiceAccounts created or changed.
	Written []string
}

// ApplyPullSecrets gives each tenant in byTenant (tenant -> namespaces) a pull
// credential for the registry at registry (host:port), and puts it in each of its
// namespaces as the kubernetes.io/dockerconfigjson Secret PullSecretName, named in the
// imagePullSecrets of the namespace's default ServiceAccount. A tenant keeps its
// credential: its password is read back from a Secret that still verifies against the
// stored hash, so applying again changes nothing; a new one is issued only when none
// does. Tenants in robots that byTenant lacks lose theirs. robots is changed in place
// (the caller saves it, also when an error is returned after a change).
func ApplyPullSecrets(ctx context.Context, client kubernetes.Interface, robots *RobotStore, byTenant map[string][]string, registry string, now time.Time) (PullSecretResult, error) {
	var res PullSecretResult
	robots.Robots = slices.DeleteFunc(robots.Robots, func(r Robot) bool {
		if _, ok := byTenant[r.Tenant]; !ok {
			res.Removed = append(res.Removed, r.Tenant)
			return true
		}
		return false
	})
	names := make([]string, 0, len(byTenant))
	for t := range byTenant {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, tenant := range names {
		nss := byTenant[tenant]
		password, err := currentPassword(ctx, client, robots.Find(tenant), nss, registry)
		if err != nil {
			return res, err
		}
		if password == "" {
			pw, hash, err := NewPassword()
			if err != nil {
				return res, err
			}
			password = pw
			if r := robots.Find(tenant); r != nil {
				r.PasswordSHA256, r.IssuedAt = hash, now.UTC()
			} else {
				robots.Robots = append(robots.Robots, Robot{Tenant: tenant, PasswordSHA256: hash, IssuedAt: now.UTC()})
			}
			res.Issued = append(res.Issued, tenant)
		}
		cfg, err := DockerConfigJSON(registry, RobotUser(tenant), password)
		if err != nil {
			return res, err
		}
		for _, ns := range nss {
			written, err := applyPullSecret(ctx, client, tenant, ns, cfg)
			if err != nil {
				return res, err
			}
			res.Written = append(res.Written, written...)
		}
	}
	return res, nil
}

// currentPassword returns the tenant's password from one of its namespaces' pull
// Secrets that verifies against r's hash, or "" when none does (or r is nil).
func currentPassword(ctx context.Context, client kubernetes.Interface, r *Robot, nss []string, registry string) (string, error) {
	if r == nil {
		return "", nil
	}
	for _, ns := range nss {
		s, err := client.CoreV1().Secrets(ns).Get(ctx, PullSecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read secret %s/%s: %w", ns, PullSecretName, err)
		}
		if pw, ok := PasswordIn(s.Data[corev1.DockerConfigJsonKey], registry, RobotUser(r.Tenant)); ok && passwordMatches(pw, r.PasswordSHA256) {
			return pw, nil
		}
	}
	return "", nil
}

// applyPullSecret makes ns's pull Secret hold cfg and its default ServiceAccount name
// it, changing only what differs. It returns what it wrote.
func applyPullSecret(ctx context.Context, client kubernetes.Interface, tenant, ns string, cfg []byte) ([]string, error) {
	var written []string
	secrets := client.CoreV1().Secrets(ns)
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PullSecretName, Namespace: ns, Labels: map[string]string{
			tenants.LabelManagedBy: ManagedBy, tenants.LabelTenant: tenant}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}
	cur, err := secrets.Get(ctx, PullSecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := secrets.Create(ctx, want, metav1.CreateOptions{FieldManager: ManagedBy}); err != nil {
			return nil, fmt.Errorf("create secret %s/%s: %w", ns, PullSecretName, err)
		}
		written = append(written, "secret "+ns+"/"+PullSecretName)
	case err != nil:
		return nil, fmt.Errorf("read secret %s/%s: %w", ns, PullSecretName, err)
	case cur.Type != want.Type:
		// The type cannot change: replace the Secret.
		if err := secrets.Delete(ctx, PullSecretName, metav1.DeleteOptions{}); err != nil {
			return nil, fmt.Errorf("replace secret %s/%s of type %s: %w", ns, PullSecretName, cur.Type, err)
		}
		return applyPullSecret(ctx, client, tenant, ns, cfg)
	case !bytes.Equal(cur.Data[corev1.DockerConfigJsonKey], cfg) || cur.Labels[tenants.LabelManagedBy] != ManagedBy:
		cur.Data = want.Data
		cur.Labels = want.Labels
		if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{FieldManager: ManagedBy}); err != nil {
			return nil, fmt.Errorf("update secret %s/%s: %w", ns, PullSecretName, err)
		}
		written = append(written, "secret "+ns+"/"+PullSecretName)
	}
	changed, err := nameInServiceAccount(ctx, client, ns)
	if err != nil {
		return written, err
	}
	if changed {
		written = append(written, "serviceaccount "+ns+"/"+ServiceAccount)
	}
	return written, nil
}

// nameInServiceAccount adds PullSecretName to the imagePullSecrets of ns's default
// ServiceAccount, creating the account if the controller manager has not yet. Other
// entries stay. It reports whether it changed anything.
func nameInServiceAccount(ctx context.Context, client kubernetes.Interface, ns string) (bool, error) {
	sas := client.CoreV1().ServiceAccounts(ns)
	ref := corev1.LocalObjectReference{Name: PullSecretName}
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sa, err := sas.Get(ctx, ServiceAccount, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			sa = &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ServiceAccount, Namespace: ns},
				ImagePullSecrets: []corev1.LocalObjectReference{ref}}
			_, err = sas.Create(ctx, sa, metav1.CreateOptions{FieldManager: ManagedBy})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("serviceaccounts"), ServiceAccount, err)
			}
			changed = err == nil
			return err
		}
		if err != nil {
			return err
		}
		if slices.Contains(sa.ImagePullSecrets, ref) {
			return nil
		}
		sa.ImagePullSecrets = append(sa.ImagePullSecrets, ref)
		_, err = sas.Update(ctx, sa, metav1.UpdateOptions{FieldManager: ManagedBy})
		changed = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("name %s in serviceaccount %s/%s: %w", PullSecretName, ns, ServiceAccount, err)
	}
	return changed, nil
}

package tenantusers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// DefaultWorkSize is the size of a work directory when users add is given no
// --work-size.
const DefaultWorkSize = "50Gi"

// WorkClaimName is the claim of user's work directory. A claim's name must be
// a DNS subdomain; a user name (userName: lowercase letters, digits, '-' and
// '.', at most 63) is one, and so is work-NAME, so the name needs no
// mapping. It need not be a DNS label, and is not one for a user with a dot
// ("ann.lee" gets work-ann.lee): nothing uses a claim's name as a label.
func WorkClaimName(user string) string { return "work-" + user }

// What Add did about a work directory (WorkDir.State).
const (
	WorkMade    = "made"     // Add created the claim
	WorkKept    = "kept"     // the claim was there already; Add left it as it was
	WorkNoClass = "no-class" // the cluster has no such StorageClass; no claim
	WorkNone    = "none"     // the work size was zero; no claim
)

// WorkDir is a user's work directory: a ReadWriteMany claim, by default of
// gpurack-shared, in one namespace of the user's tenant.
type WorkDir struct {
	State     string
	Namespace string
	Claim     string
	Class     string
	// Size is the storage the claim requests (for WorkKept, what the claim
	// that was there requests).
	Size resource.Quantity
}

// String is the line users add prints about the work directory.
func (w WorkDir) String() string {
	switch w.State {
	case WorkNoClass:
		return fmt.Sprintf("no work directory was made: the cluster has no StorageClass %s (storage.nfs in cluster.yaml)", w.Class)
	case WorkNone:
		return "no work directory (--work-size 0)"
	}
	kept := ""
	if w.State == WorkKept {
		kept = ", already there: left as it was"
	}
	return fmt.Sprintf("work directory: PVC %s/%s (%s, %s%s); mount it in a pod as claimName: %s",
		w.Namespace, w.Claim, w.Class, w.Size.String(), kept, w.Claim)
}

// workNamespace is where a tenant's users get their work directories: the
// namespace named for the tenant (tenants.yaml's default namespace) when the
// tenant has it, else the first of nss (sorted, as TenantNamespaces returns
// them), so that every run of users add picks the same one.
func workNamespace(tenant string, nss []string) string {
	if slices.Contains(nss, tenant) {
		return tenant
	}
	return nss[0]
}

// makeWorkDir makes the claim of opts.User's work directory in one of nss
// (workNamespace), of opts.WorkClass and opts.WorkSize, ReadWriteMany,
// labelled with the tenant and the user. A claim of that name that is there
// already is left as it is (users add runs again to issue a new credential
// after a revoke). No claim is made when the size is zero or when the
// cluster has no such StorageClass. The claim counts against the tenant's
// ResourceQuota; when it exceeds it, the error says which quota to raise.
func makeWorkDir(ctx context.Context, client kubernetes.Interface, opts AddOptions, nss []string) (WorkDir, error) {
	w := WorkDir{Namespace: workNamespace(opts.Tenant, nss), Claim: WorkClaimName(opts.User), Class: opts.WorkClass, Size: opts.WorkSize}
	if w.Class == "" {
		w.Class = sharedvol.StorageClass
	}
	if w.Size.IsZero() {
		w.State = WorkNone
		return w, nil
	}
	claims := client.CoreV1().PersistentVolumeClaims(w.Namespace)
	if cur, err := claims.Get(ctx, w.Claim, metav1.GetOptions{}); err == nil {
		return keptWorkDir(w, cur), nil
	} else if !apierrors.IsNotFound(err) {
		return w, fmt.Errorf("read the work directory claim %s/%s: %w", w.Namespace, w.Claim, err)
	}
	if _, err := client.StorageV1().StorageClasses().Get(ctx, w.Class, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		w.State = WorkNoClass
		return w, nil
	} else if err != nil {
		return w, fmt.Errorf("read StorageClass %s: %w", w.Class, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: w.Claim, Namespace: w.Namespace, Labels: map[string]string{
			tenants.LabelTenant: opts.Tenant, LabelUser: opts.User, tenants.LabelManagedBy: ManagedBy,
		}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &w.Class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: w.Size}},
		},
	}
	_, err := claims.Create(ctx, pvc, metav1.CreateOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		w.State = WorkMade
		return w, nil
	case apierrors.IsAlreadyExists(err):
		cur, err := claims.Get(ctx, w.Claim, metav1.GetOptions{})
		if err != nil {
			return w, fmt.Errorf("read the work directory claim %s/%s: %w", w.Namespace, w.Claim, err)
		}
		return keptWorkDir(w, cur), nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return w, fmt.Errorf("the work directory of %s (claim %s/%s, %s %s) is over tenant %s's quota: %w; "+
			"raise quota.storageClasses.%s (requests, claims) or quota.storage of tenant %[6]s in tenants.yaml and run `tenants apply`, "+
			"or give users add a smaller --work-size (0 for no work directory); no credential was issued",
			opts.User, w.Namespace, w.Claim, w.Class, w.Size.String(), opts.Tenant, err, w.Class)
	default:
		return w, fmt.Errorf("make the work directory claim %s/%s: %w", w.Namespace, w.Claim, err)
	}
}

// keptWorkDir is w as the claim cur, which was there already, says.
func keptWorkDir(w WorkDir, cur *corev1.PersistentVolumeClaim) WorkDir {
	w.State = WorkKept
	w.Class = ""
	if cur.Spec.StorageClassName != nil {
		w.Class = *cur.Spec.StorageClassName
	}
	w.Size = cur.Spec.Resources.Requests[corev1.ResourceStorage]
	return w
}

// WorkClaims lists the work directory claims users add made for user, as
// "namespace/name", sorted. Revoke leaves them, with their data.
func WorkClaims(ctx context.Context, client kubernetes.Interface, user string) ([]string, error) {
	if !userName.MatchString(user) {
		return nil, nil // no label value; Add never made a claim for it
	}
	list, err := client.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: LabelUser + "=" + user + "," + tenants.LabelManagedBy + "=" + ManagedBy,
	})
	if err != nil {
		return nil, fmt.Errorf("list the work directories of %s: %w", user, err)
	}
	var out []string
	for _, c := range list.Items {
		out = append(out, c.Namespace+"/"+c.Name)
	}
	slices.Sort(out)
	return out, nil
}

// Package tenantusers issues, lists and revokes the client-certificate
// credentials of tenant users (`controlplane-bootstrap users`).
//
// kube-apiserver has no revocation list for client certificates: a
// certificate signed by the cluster CA authenticates until it expires. So a
// credential here grants nothing by itself. Its certificate carries a group
// of its own, gpurack:user:NAME:ID, with a fresh random ID per issue, and
// only RoleBindings naming that group give it rights. Revoking deletes those
// bindings; the certificate still authenticates, but as an identity that may
// do nothing. Because the ID is never bound again, issuing the same user a
// new credential does not bring an old certificate back. See
// docs/tenants.md.
//
// Each user also gets a work directory (work.go): a claim of the
// gpurack-shared StorageClass in the tenant's namespace, which outlives the
// user's credentials.
//
// It does not make the tenants' Roles (package tenants) and keeps its
// records in a JSON file in the cluster directory.
package tenantusers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	rbacapply "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// Roles a user can have in a tenant.
const (
	RoleUser  = "user"
	RoleAdmin = "admin"
)

// Labels on the bindings of a credential.
const (
	LabelUser       = "gpurack.io/user"
	LabelCredential = "gpurack.io/credential"
	ManagedBy       = "gpurack-users"
	FieldManager    = "gpurack-users"
	// StoreFile is the record of credentials, relative to the cluster
	// directory.
	StoreFile = "users/credentials.json"
	// DefaultTTL is the lifetime of a certificate issued without --ttl.
	DefaultTTL = 30 * 24 * time.Hour
)

// CredentialGroup is the group that carries a credential's bindings.
func CredentialGroup(user, id string) string { return "gpurack:user:" + user + ":" + id }

// MemberGroup records, in the certificate, the tenant and role the
// credential was issued for. No binding names it (so that revoking one user
// does not depend on every other holder of the group), and `tenants apply`
// never binds it.
func MemberGroup(tenant, role string) string {
	return "gpurack:tenant-cert:" + tenant + ":" + role + "s"
}

// Credential is one issued certificate.
type Credential struct {
	User      string     `json:"user"`
	Tenant    string     `json:"tenant"`
	Role      string     `json:"role"`
	ID        string     `json:"id"`
	Serial    string     `json:"serial"` // hex
	Groups    []string   `json:"groups"`
	IssuedAt  time.Time  `json:"issuedAt"`
	NotAfter  time.Time  `json:"notAfter"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
	// RegistryPasswordSHA256 is the hex SHA-256 of the credential's image registry
	// password (package registryauth), which only the user's auth file holds; empty
	// for a credential issued without one (and in stores written before it existed).
	RegistryPasswordSHA256 string `json:"registryPasswordSHA256,omitempty"`
}

// State is "active", "revoked" or "expired" at now.
func (c Credential) State(now time.Time) string {
	switch {
	case c.RevokedAt != nil:
		return "revoked"
	case !now.Before(c.NotAfter):
		return "expired"
	}
	return "active"
}

// Store is the record of every credential ever issued, revoked ones
// included, so that `users list` shows them and an ID is never reused.
type Store struct {
	Credentials []Credential `json:"credentials"`
}

// LoadStore reads path; a missing file is an empty store.
func LoadStore(path string) (*Store, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Store{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("user credentials: %w", err)
	}
	var s Store
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("user credentials %s: %w; restore it from a backup", path, err)
	}
	return &s, nil
}

// Save writes the store atomically.
func (s *Store) Save(path string) error {
	return atomicfile.WriteJSON(path, s, 0o600, 0o700)
}

// Active returns the user's credentials that are neither revoked nor
// expired at now.
func (s *Store) Active(user string, now time.Time) []Credential {
	var out []Credential
	for _, c := range s.Credentials {
		if c.User == user && c.State(now) == "active" {
			out = append(out, c)
		}
	}
	return out
}

var userName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// AddOptions describe a credential to issue.
type AddOptions struct {
	User, Tenant, Role string
	TTL                time.Duration
	// ClusterName and Server go into the kubeconfig.
	ClusterName, Server string
	Now                 time.Time
	// WorkSize is the size of the user's work directory (WorkClaimName); zero
	// makes none.
	WorkSize resource.Quantity
	// WorkClass is the work directory's StorageClass; empty means
	// sharedvol.StorageClass (gpurack-shared).
	WorkClass string
}

// Issued is what Add made: the kubeconfig, the credential it holds, and what
// became of the user's work directory.
type Issued struct {
	Kubeconfig []byte
	Credential Credential
	Work       WorkDir
}

// Add issues a credential: a client certificate from the cluster CA for
// opts.User with a new credential group, and bindings of that group to the
// tenant's Role in each of the tenant's namespaces (and, for admins, to the
// tenant-admin ClusterRole). Before that it makes the user's work directory
// (makeWorkDir), unless it is there already. It records the credential in s
// (the caller saves s) and returns the kubeconfig. It refuses a user who
// holds an active credential.
func Add(ctx context.Context, client kubernetes.Interface, set *clusterpki.Set, s *Store, opts AddOptions) (*Issued, error) {
	if !userName.MatchString(opts.User) || len(opts.User) > 63 {
		return nil, fmt.Errorf("user name %q: use lowercase letters, digits, '-' and '.', at most 63", opts.User)
	}
	if opts.Role != RoleUser && opts.Role != RoleAdmin {
		return nil, fmt.Errorf("role %q: use %s or %s", opts.Role, RoleUser, RoleAdmin)
	}
	if opts.TTL <= 0 {
		return nil, fmt.Errorf("ttl %v: give a positive duration such as 720h", opts.TTL)
	}
	if opts.WorkSize.Sign() < 0 {
		return nil, fmt.Errorf("work size %s: give a size such as %s, or 0 for no work directory", opts.WorkSize.String(), DefaultWorkSize)
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if act := s.Active(opts.User, opts.Now); len(act) > 0 {
		return nil, fmt.Errorf("user %s already holds credential %s (tenant %s, until %s); revoke it first with `users revoke %s`",
			opts.User, act[0].ID, act[0].Tenant, act[0].NotAfter.Format(time.RFC3339), opts.User)
	}
	nss, err := TenantNamespaces(ctx, client, opts.Tenant)
	if err != nil {
		return nil, err
	}
	// The work directory comes before the credential: when quota refuses the
	// claim, nothing has been issued or bound, and users add, run again once
	// the quota is raised, does the whole thing. A claim made before a later
	// step fails is no harm: the next run finds it and keeps it.
	work, err := makeWorkDir(ctx, client, opts, nss)
	if err != nil {
		return nil, err
	}
	id, err := newID(s)
	if err != nil {
		return nil, err
	}
	groups := []string{CredentialGroup(opts.User, id), MemberGroup(opts.Tenant, opts.Role)}
	kp, err := set.CA.Issue(pki.CertRequest{
		CommonName: opts.User, Organizations: groups, Usages: []pki.Usage{pki.ClientAuth},
		Validity: opts.TTL, NotBefore: opts.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("issue the certificate of %s: %w", opts.User, err)
	}
	cred := Credential{
		User: opts.User, Tenant: opts.Tenant, Role: opts.Role, ID: id,
		Serial: kp.Cert.SerialNumber.Text(16), Groups: groups,
		IssuedAt: opts.Now.UTC(), NotAfter: kp.Cert.NotAfter.UTC(),
	}
	if err := bind(ctx, client, cred, nss); err != nil {
		return nil, err
	}
	s.Credentials = append(s.Credentials, cred)
	kc, err := clusterpki.KubeconfigBytes(opts.ClusterName, opts.Server, set.CACertPEM(), opts.User, kp)
	if err != nil {
		return nil, err
	}
	return &Issued{Kubeconfig: kc, Credential: cred, Work: work}, nil
}

func newID(s *Store) (string, error) {
	for range 10 {
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		id := hex.EncodeToString(b)
		if !slices.ContainsFunc(s.Credentials, func(c Credential) bool { return c.ID == id }) {
			return id, nil
		}
	}
	return "", errors.New("no unused credential ID after 10 tries")
}

// TenantNamespaces lists the namespaces `tenants apply` made for tenant.
func TenantNamespaces(ctx context.Context, client kubernetes.Interface, tenant string) ([]string, error) {
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{
		LabelSelector: tenants.LabelTenant + "=" + tenant + "," + tenants.LabelManagedBy + "=" + tenants.ManagedBy,
	})
	if err != nil {
		return nil, fmt.Errorf("list the namespaces of tenant %s: %w", tenant, err)
	}
	var out []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			out = append(out, ns.Name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tenant %q has no namespaces in the cluster; add it to tenants.yaml and run `tenants apply` first", tenant)
	}
	slices.Sort(out)
	return out, nil
}

func bindingName(user string) string { return "gpurack-user-" + user }

func bindingLabels(c Credential) map[string]string {
	return map[string]string{
		LabelUser: c.User, LabelCredential: c.ID, tenants.LabelTenant: c.Tenant,
		tenants.LabelManagedBy: ManagedBy,
	}
}

// bind applies the credential's bindings in namespaces nss.
func bind(ctx context.Context, client kubernetes.Interface, c Credential, nss []string) error {
	role := tenants.RoleUser
	if c.Role == RoleAdmin {
		role = tenants.RoleAdmin
	}
	subject := rbacapply.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.GroupKind).WithName(CredentialGroup(c.User, c.ID))
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	for _, ns := range nss {
		rb := rbacapply.RoleBinding(bindingName(c.User), ns).WithLabels(bindingLabels(c)).
			WithRoleRef(rbacapply.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(role)).
			WithSubjects(subject)
		if _, err := client.RbacV1().RoleBindings(ns).Apply(ctx, rb, opts); err != nil {
			return fmt.Errorf("bind %s in namespace %s: %w", c.User, ns, err)
		}
	}
	if c.Role == RoleAdmin {
		crb := rbacapply.ClusterRoleBinding(bindingName(c.User)).WithLabels(bindingLabels(c)).
			WithRoleRef(rbacapply.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(tenants.ClusterRoleAdmin)).
			WithSubjects(subject)
		if _, err := client.RbacV1().ClusterRoleBindings().Apply(ctx, crb, opts); err != nil {
			return fmt.Errorf("bind %s to %s: %w", c.User, tenants.ClusterRoleAdmin, err)
		}
	}
	return nil
}

// Rebind applies the bindings of every active credential again, in the
// tenant's current namespaces: after `tenants apply` added a namespace to a
// tenant, its users reach it too. Credentials of tenants that no longer
// have namespaces are skipped.
func Rebind(ctx context.Context, client kubernetes.Interface, s *Store, now time.Time) error {
	for _, c := range s.Credentials {
		if c.State(now) != "active" {
			continue
		}
		nss, err := TenantNamespaces(ctx, client, c.Tenant)
		if err != nil {
			continue
		}
		if err := bind(ctx, client, c, nss); err != nil {
			return err
		}
	}
	return nil
}

// Revoke removes every binding that grants user anything through a
// gpurack credential (labeled with the user, or naming one of the user's
// credential groups, wherever it is), marks the user's credentials revoked
// in s (the caller saves s), and waits until the apiserver's authorizer
// denies the revoked identities. It returns the bindings it deleted. The
// user's work directory stays, with its data (WorkClaims lists it).
func Revoke(ctx context.Context, client kubernetes.Interface, s *Store, user string, now time.Time) ([]string, error) {
	known := slices.ContainsFunc(s.Credentials, func(c Credential) bool { return c.User == user })
	prefix := "gpurack:user:" + user + ":"
	grants := func(labels map[string]string, subjects []rbacv1.Subject) bool {
		if labels[LabelUser] == user && labels[tenants.LabelManagedBy] == ManagedBy {
			return true
		}
		return slices.ContainsFunc(subjects, func(sub rbacv1.Subject) bool {
			return sub.Kind == rbacv1.GroupKind && strings.HasPrefix(sub.Name, prefix)
		})
	}
	var deleted []string
	rbs, err := client.RbacV1().RoleBindings(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list role bindings: %w", err)
	}
	for _, rb := range rbs.Items {
		if !grants(rb.Labels, rb.Subjects) {
			continue
		}
		if err := client.RbacV1().RoleBindings(rb.Namespace).Delete(ctx, rb.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("delete rolebinding %s/%s: %w", rb.Namespace, rb.Name, err)
		}
		deleted = append(deleted, "rolebinding "+rb.Namespace+"/"+rb.Name)
	}
	crbs, err := client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return deleted, fmt.Errorf("list cluster role bindings: %w", err)
	}
	for _, crb := range crbs.Items {
		if !grants(crb.Labels, crb.Subjects) {
			continue
		}
		if err := client.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("delete clusterrolebinding %s: %w", crb.Name, err)
		}
		deleted = append(deleted, "clusterrolebinding "+crb.Name)
	}
	if !known && len(deleted) == 0 {
		return nil, fmt.Errorf("no credential was ever issued to %q (see `users list`)", user)
	}
	var revoked []Credential
	for i := range s.Credentials {
		c := &s.Credentials[i]
		if c.User == user && c.RevokedAt == nil {
			t := now.UTC()
			c.RevokedAt = &t
			revoked = append(revoked, *c)
		}
	}
	for _, c := range revoked {
		if err := waitDenied(ctx, client, c); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// waitDenied polls a SubjectAccessReview for c's identity until the
// authorizer (whose RBAC cache follows the bindings by watch) no longer lets
// it read pods in any of its tenant's namespaces.
func waitDenied(ctx context.Context, client kubernetes.Interface, c Credential) error {
	nss, _ := TenantNamespaces(ctx, client, c.Tenant)
	if len(nss) == 0 {
		nss = []string{corev1.NamespaceDefault}
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, ns := range nss {
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: c.User, Groups: append(append([]string{}, c.Groups...), "system:authenticated"),
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "pods"},
			}}
			res, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			if res.Status.Allowed {
				last = fmt.Sprintf("still allowed to get pods in %s (%s)", ns, res.Status.Reason)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("bindings of %s deleted, but the apiserver %s after 60s: %w", c.User, last, err)
	}
	return nil
}

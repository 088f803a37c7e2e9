package joinconfig

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

// TokenOptions describes a bootstrap token to create.
type TokenOptions struct {
	// TTL is how long the token lives; the tokencleaner deletes it after.
	TTL time.Duration
	// Description is stored in the Secret for operators.
	Description string
	// Groups are the auth-extra-groups; default NodeBootstrapGroup.
	Groups []string
	// Usages default to authentication and signing.
	Usages []string
}

// Token is one bootstrap token as read from its Secret.
type Token struct {
	ID          string
	Secret      string
	Expires     time.Time // zero: never
	Usages      []string
	Groups      []string
	Description string
}

// String is the token in the standard "abcdef.0123456789abcdef" form.
func (t Token) String() string { return bootstraputil.TokenFromIDAndSecret(t.ID, t.Secret) }

// TokenSecret builds the kube-system Secret for token (kubeadm's format).
func TokenSecret(token string, opts TokenOptions, now time.Time) (*corev1.Secret, error) {
	parts := bootstraputil.BootstrapTokenRegexp.FindStringSubmatch(token)
	if parts == nil {
		return nil, fmt.Errorf("token %q is not of the form [a-z0-9]{6}.[a-z0-9]{16}", token)
	}
	id, secret := parts[1], parts[2]
	groups := opts.Groups
	if len(groups) == 0 {
		groups = []string{NodeBootstrapGroup}
	}
	for _, g := range groups {
		if err := bootstraputil.ValidateBootstrapGroupName(g); err != nil {
			return nil, err
		}
	}
	usages := opts.Usages
	if len(usages) == 0 {
		usages = []string{"authentication", "signing"}
	}
	if err := bootstraputil.ValidateUsages(usages); err != nil {
		return nil, err
	}
	data := map[string][]byte{
		bootstrapapi.BootstrapTokenIDKey:          []byte(id),
		bootstrapapi.BootstrapTokenSecretKey:      []byte(secret),
		bootstrapapi.BootstrapTokenExtraGroupsKey: []byte(strings.Join(groups, ",")),
		bootstrapapi.BootstrapTokenDescriptionKey: []byte(opts.Description),
	}
	if opts.TTL > 0 {
		data[bootstrapapi.BootstrapTokenExpirationKey] = []byte(now.Add(opts.TTL).UTC().Format(time.RFC3339))
	}
	for _, u := range usages {
		data[bootstrapapi.BootstrapTokenUsagePrefix+u] = []byte("true")
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: bootstraputil.BootstrapTokenSecretName(id)},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data:       data,
	}, nil
}

// CreateToken generates a token, stores its Secret and returns it.
func CreateToken(ctx context.Context, client kubernetes.Interface, opts TokenOptions) (Token, error) {
	token, err := bootstraputil.GenerateBootstrapToken()
	if err != nil {
		return Token{}, err
	}
	sec, err := TokenSecret(token, opts, time.Now())
	if err != nil {
		return Token{}, err
	}
	if _, err := client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, sec, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
		return Token{}, fmt.Errorf("create bootstrap token: %w", err)
	}
	return tokenFromSecret(sec)
}

func tokenFromSecret(s *corev1.Secret) (Token, error) {
	t := Token{
		ID:          string(s.Data[bootstrapapi.BootstrapTokenIDKey]),
		Secret:      string(s.Data[bootstrapapi.BootstrapTokenSecretKey]),
		Description: string(s.Data[bootstrapapi.BootstrapTokenDescriptionKey]),
	}
	if g := string(s.Data[bootstrapapi.BootstrapTokenExtraGroupsKey]); g != "" {
		t.Groups = strings.Split(g, ",")
	}
	if e := string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]); e != "" {
		exp, err := time.Parse(time.RFC3339, e)
		if err != nil {
			return t, fmt.Errorf("secret %s: expiration %q: %w", s.Name, e, err)
		}
		t.Expires = exp
	}
	for k, v := range s.Data {
		if u, ok := strings.CutPrefix(k, bootstrapapi.BootstrapTokenUsagePrefix); ok && string(v) == "true" {
			t.Usages = append(t.Usages, u)
		}
	}
	slices.Sort(t.Usages)
	return t, nil
}

// ListTokens returns the bootstrap tokens in kube-system, sorted by ID.
func ListTokens(ctx context.Context, client kubernetes.Interface) ([]Token, error) {
	list, err := client.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
		FieldSelector: "type=" + string(bootstrapapi.SecretTypeBootstrapToken),
	})
	if err != nil {
		return nil, fmt.Errorf("list bootstrap tokens: %w", err)
	}
	var out []Token
	for i := range list.Items {
		t, err := tokenFromSecret(&list.Items[i])
		if err != nil {
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Token) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// ErrNoSuchToken is returned by RevokeToken for an unknown token ID.
var ErrNoSuchToken = errors.New("no such bootstrap token")

// RevokeToken deletes the Secret of token id (the part before the dot; a
// whole token is accepted too).
func RevokeToken(ctx context.Context, client kubernetes.Interface, id string) error {
	id, _, _ = strings.Cut(id, ".")
	if !bootstraputil.IsValidBootstrapTokenID(id) {
		return fmt.Errorf("%q is not a bootstrap token ID (six characters [a-z0-9], the part before the dot)", id)
	}
	err := client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, bootstraputil.BootstrapTokenSecretName(id), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("revoke %s: %w (see `token list`)", id, ErrNoSuchToken)
	}
	if err != nil {
		return fmt.Errorf("revoke %s: %w", id, err)
	}
	return nil
}

// ClusterInfoSignature returns the JWS the bootstrapsigner added to
// kube-public/cluster-info for token id, or "".
func ClusterInfoSignature(cm *corev1.ConfigMap, id string) string {
	return cm.Data[bootstrapapi.JWSSignatureKeyPrefix+id]
}

// VerifyClusterInfo checks cluster-info's signature for token with
// k8s.io/cluster-bootstrap's JWS code, the check `kubeadm join` makes.
func VerifyClusterInfo(cm *corev1.ConfigMap, token string) error {
	parts := bootstraputil.BootstrapTokenRegexp.FindStringSubmatch(token)
	if parts == nil {
		return fmt.Errorf("%q is not a bootstrap token", token)
	}
	sig := ClusterInfoSignature(cm, parts[1])
	if sig == "" {
		return fmt.Errorf("cluster-info has no signature for token %s", parts[1])
	}
	if !jws.DetachedTokenIsValid(sig, cm.Data[bootstrapapi.KubeConfigKey], parts[1], parts[2]) {
		return fmt.Errorf("cluster-info's signature for token %s does not verify", parts[1])
	}
	return nil
}

// WaitSigned waits until the bootstrapsigner has signed cluster-info with
// token, so a `kubeadm join` started right after discovery succeeds.
func WaitSigned(ctx context.Context, client kubernetes.Interface, token string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		last = VerifyClusterInfo(cm, token)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the controller-manager's bootstrapsigner to sign cluster-info: %v (last: %v); is kube-controller-manager running with --controllers=*,bootstrapsigner,tokencleaner?", err, last)
	}
	return nil
}

// WaitRevoked waits until token no longer authenticates to the apiserver of
// base (its token authenticator works from a cache, so a deleted token is
// refused a moment later, not at once).
func WaitRevoked(ctx context.Context, base *rest.Config, token string) error {
	cfg := rest.AnonymousClientConfig(base)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
}

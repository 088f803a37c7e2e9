package controlplane_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// TestEnrollerTokenLimits checks, against a real API server, that the enroller's
// admission policy refuses bootstrap tokens that never expire or outlive an hour
// from their creation (the policy decodes the base64 expiry itself), carry other
// usages or put their holder in another group (docs/contracts.md §4), and admits the
// tokens gpuboot mints.
func TestEnrollerTokenLimits(t *testing.T) {
	c := testcluster.Shared(t)
	enroller, err := kubernetes.NewForConfig(testcluster.RESTConfigFrom(t, c.EnrollerKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	secrets := enroller.CoreV1().Secrets(metav1.NamespaceSystem)
	now := time.Now()
	n := 0
	token := func(ttl time.Duration) *corev1.Secret {
		n++
		s, err := joinconfig.TokenSecret(fmt.Sprintf("limit%c.0123456789abcdef", 'a'+n), joinconfig.TokenOptions{TTL: ttl}, now)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Admitted: the kubeadm-form token, and one written the way gpuboot writes it
	// (stringData, which the API server folds into data before admission).
	normal := token(15 * time.Minute)
	hour := token(time.Hour - time.Minute) // the longest the policy admits, less the test's own delay
	gpuboot := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-limitg", Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": "limitg", "token-secret": "0123456789abcdef",
			"expiration":                     now.Add(15 * time.Minute).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
			"auth-extra-groups": joinconfig.NodeBootstrapGroup,
		},
	}
	for what, s := range map[string]*corev1.Secret{"a 15-minute token": normal, "a 59-minute token": hour, "a token in gpuboot's form": gpuboot} {
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Errorf("enroller creating %s: %v", what, err)
			continue
		}
		if err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("enroller deleting %s: %v", what, err)
		}
	}

	// Refused.
	never := token(0) // no expiration key: never expires
	day := token(24 * time.Hour)
	hourAndMinute := token(time.Hour + time.Minute)
	offset := token(15 * time.Minute) // the same instant, with an offset instead of Z
	offset.Data["expiration"] = []byte(now.Add(15 * time.Minute).In(time.FixedZone("", 3600)).Format(time.RFC3339))
	garbage := token(15 * time.Minute)
	garbage.Data["expiration"] = []byte("2026-13-45T99:99:99Z")
	masters := token(15 * time.Minute)
	masters.Data["auth-extra-groups"] = []byte("system:masters")
	twoGroups := token(15 * time.Minute)
	twoGroups.Data["auth-extra-groups"] = []byte(joinconfig.NodeBootstrapGroup + ",system:bootstrappers:other")
	noAuth := token(15 * time.Minute)
	delete(noAuth.Data, "usage-bootstrap-authentication")
	otherUsage := token(15 * time.Minute)
	otherUsage.Data["usage-bootstrap-other"] = []byte("true")
	for what, s := range map[string]*corev1.Secret{
		"a token that never expires":      never,
		"a token that lives a day":        day,
		"a token that lives 61 minutes":   hourAndMinute,
		"an expiry with a UTC offset":     offset,
		"an expiry that is no time":       garbage,
		"a token in group system:masters": masters,
		"a token in a second group":       twoGroups,
		"a token without authentication":  noAuth,
		"a token with another usage":      otherUsage,
	} {
		_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
		if err == nil {
			t.Errorf("enroller created %s", what)
			secrets.Delete(ctx, s.Name, metav1.DeleteOptions{})
			continue
		}
		if !strings.Contains(err.Error(), joinconfig.EnrollerPolicy) && !strings.Contains(err.Error(), "may only create") {
			t.Errorf("enroller creating %s: %v, want the admission policy's refusal", what, err)
		}
		if expiry := strings.HasPrefix(what, "an expiry") || strings.Contains(what, "lives"); expiry && !strings.Contains(err.Error(), "expire within 1h0m0s of their creation") {
			t.Errorf("enroller creating %s: %v, want the refusal of the expiry bound", what, err)
		}
	}
}

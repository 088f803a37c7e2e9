package joinconfig

import (
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
)

func cfg(t *testing.T) *clusterconfig.Config {
	c, err := clusterconfig.Parse("t.yaml", []byte("apiServer:\n  endpoint: cp.example.com:6443\n"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTokenSecretIsKubeadmFormat(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s, err := TokenSecret("abcdef.0123456789abcdef", TokenOptions{TTL: 15 * time.Minute, Description: "m1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "bootstrap-token-abcdef" || s.Namespace != "kube-system" || s.Type != bootstrapapi.SecretTypeBootstrapToken {
		t.Errorf("secret %s/%s type %s", s.Namespace, s.Name, s.Type)
	}
	want := map[string]string{
		"token-id": "abcdef", "token-secret": "0123456789abcdef", "expiration": "2026-01-02T03:19:05Z",
		"usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
		"auth-extra-groups": NodeBootstrapGroup, "description": "m1",
	}
	for k, v := range want {
		if string(s.Data[k]) != v {
			t.Errorf("%s = %q, want %q", k, s.Data[k], v)
		}
	}
	tok, err := tokenFromSecret(s)
	if err != nil || tok.String() != "abcdef.0123456789abcdef" || !tok.Expires.Equal(now.Add(15*time.Minute)) {
		t.Errorf("round trip: %+v %v", tok, err)
	}
	for _, bad := range []string{"ABCDEF.0123456789abcdef", "abcdef0123456789abcdef", "abc.def"} {
		if _, err := TokenSecret(bad, TokenOptions{}, now); err == nil {
			t.Errorf("token %q accepted", bad)
		}
	}
	if _, err := TokenSecret("abcdef.0123456789abcdef", TokenOptions{Groups: []string{"admins"}}, now); err == nil {
		t.Error("a group outside system:bootstrappers: accepted")
	}
}

func TestObjects(t *testing.T) {
	c := cfg(t)
	objs, err := Objects(c, []byte("CA"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.Name())
	}
	for _, want := range []string{
		"configmaps kube-public/cluster-info",
		"clusterrolebindings kubeadm:kubelet-bootstrap",
		"clusterrolebindings kubeadm:node-autoapprove-bootstrap",
		"clusterrolebindings kubeadm:node-autoapprove-certificate-rotation",
		"clusterrolebindings kubeadm:get-nodes",
		"rolebindings kube-public/kubeadm:bootstrap-signer-clusterinfo",
		"configmaps kube-system/kubeadm-config",
		"configmaps kube-system/kubelet-config",
		"roles kube-system/gpurack:enroller",
		"clusterroles gpurack:enroller",
		"validatingadmissionpolicies " + EnrollerPolicy,
		"validatingadmissionpolicybindings " + EnrollerPolicy,
		"validatingadmissionpolicies " + EnrollerNodePolicy,
		"validatingadmissionpolicybindings " + EnrollerNodePolicy,
		"clusterroles " + NodeReaderRole,
		"clusterrolebindings " + NodeReaderRole,
		"clusterrolebindings " + NodeProxierBinding,
		"clusterroles " + NodePolicyReaderRole,
		"clusterrolebindings " + NodePolicyReaderRole,
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s in %v", want, names)
		}
	}
	// What the nodes get is read-only: no grant bound to system:nodes writes.
	roles := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		if r, ok := o.Obj.(*rbacv1.ClusterRole); ok {
			roles[r.Name] = r.Rules
		}
	}
	for _, o := range objs {
		b, ok := o.Obj.(*rbacv1.ClusterRoleBinding)
		if !ok || !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Name == NodesGroup }) {
			continue
		}
		for _, r := range roles[b.RoleRef.Name] {
			for _, v := range r.Verbs {
				if v != "get" && v != "list" && v != "watch" {
					t.Errorf("%s gives system:nodes %s on %v", b.Name, v, r.Resources)
				}
			}
		}
	}
	// The Node policy is created before the Secret policy WaitEnrollerPolicy probes.
	if i, j := slices.Index(names, "validatingadmissionpolicies "+EnrollerNodePolicy), slices.Index(names, "validatingadmissionpolicies "+EnrollerPolicy); i > j {
		t.Errorf("%s applied after %s: WaitEnrollerPolicy's probe would not cover it", EnrollerNodePolicy, EnrollerPolicy)
	}
	// The enroller gets no Node verb beyond what gpuboot uses, and no subresource.
	for _, r := range roles["gpurack:enroller"] {
		if slices.Contains(r.Resources, "nodes") && !slices.Equal(r.Verbs, []string{"get", "list", "watch", "patch", "delete"}) {
			t.Errorf("enroller's Node verbs %v", r.Verbs)
		}
		for _, res := range r.Resources {
			if strings.HasPrefix(res, "nodes/") {
				t.Errorf("enroller granted %s", res)
			}
		}
	}
	for _, o := range objs {
		if p, ok := o.Obj.(*admissionv1.ValidatingAdmissionPolicy); ok {
			if *p.Spec.FailurePolicy != admissionv1.Fail || !strings.Contains(p.Spec.MatchConditions[0].Expression, EnrollerUser) {
				t.Errorf("policy %+v", p.Spec)
			}
		}
	}
}

func TestClusterInfoAndKubeadmConfig(t *testing.T) {
	c := cfg(t)
	cm, err := ClusterInfo(c, []byte("CA"))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load([]byte(cm.Data["kubeconfig"]))
	if err != nil {
		t.Fatal(err)
	}
	if kc.Clusters[""].Server != "https://cp.example.com:6443" || string(kc.Clusters[""].CertificateAuthorityData) != "CA" {
		t.Errorf("cluster-info kubeconfig %+v", kc.Clusters[""])
	}
	cc := ClusterConfiguration(c)
	for _, want := range []string{"kind: ClusterConfiguration", "apiVersion: kubeadm.k8s.io/v1beta4", "controlPlaneEndpoint: cp.example.com:6443", "kubernetesVersion: v1.34.2"} {
		if !strings.Contains(cc, want) {
			t.Errorf("ClusterConfiguration lacks %q", want)
		}
	}
	if ClusterDNS(c) != "10.96.0.10" || !strings.Contains(KubeletConfiguration(c), "- 10.96.0.10") {
		t.Errorf("cluster DNS %s", ClusterDNS(c))
	}
}

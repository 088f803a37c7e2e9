package qemu

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/netnstest"
)

// isolationTenants: beta lets alpha and default in (allowFrom), alpha lets no other
// tenant in. Each has 1 GPU in the job queues' cohort (queuedTraining on B).
const isolationTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 1}
  - name: beta
    quota: {gpus: 1}
    allowFrom: [alpha, default]
`

// reachPatience is how long a probe pod that must reach its targets tries again
// (probe fetch --patience).
const reachPatience = 90 * time.Second

// connectSamples is how many connections the latency figures take to each target.
const connectSamples = 10

// tenantIsolation applies two tenants with `controlplane-bootstrap tenants apply` and
// checks, with probe pods on the node, that gpuagent enforces their default-deny
// NetworkPolicies (agent/netpol, kube-network-policies embedded): a pod of beta
// cannot reach a pod of alpha; alpha's pods reach alpha's, beta's (beta's allowFrom)
// and the cluster DNS; removing alpha's policy lets beta in. It logs the connect time
// of new connections to a policy-selected pod (the first packet judged in user space)
// beside those to a pod no policy selects, from the same pod, and how long a policy
// change takes to be enforced (policyChangeToEnforced).
//
// The node's gpuagent may have restarted (restartNodeServices): after must be the
// console's line count then, so that the line that says the NetworkPolicy service
// runs is one the running agent wrote. The positive control (alpha reaches its own
// pod) runs first, so that a refused pod proves the policy and not a broken pod
// network, and a refusal must be a drop (the connection timed out), which is what a
// NetworkPolicy does, not any failure.
func tenantIsolation(t *testing.T, ctx context.Context, env *netnstest.Env, ns, bin string, cp *namespacedControlPlane,
	admin kubernetes.Interface, node *corev1.Node, con *serialConsole, after int) {
	t.Helper()
	con.waitFrom(t, regexp.MustCompile(`gpuagent: network policy: enforcing NetworkPolicy`), after, 3*time.Minute)
	file := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(file, []byte(isolationTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := env.Run(ns, bin, "tenants", "apply", "--dir", cp.dir, file)
	if err != nil {
		t.Fatalf("tenants apply: %v\n%s", err, out)
	}
	a1, _ := startProbeServer(t, ctx, admin, node, "alpha", "a1")
	b1, _ := startProbeServer(t, ctx, admin, node, "beta", "b1")
	open, _ := startProbeServer(t, ctx, admin, node, metav1.NamespaceDefault, "no-policy")
	url := func(p *corev1.Pod) string { return "http://" + p.Status.PodIP + ":8080/healthz" }

	// fetch runs `probe fetch` of urls from a new pod in ns; it returns the pod's
	// report and whether every URL answered.
	fetch := func(ns, name string, urls ...string) (string, bool) {
		p, err := runPodToEnd(ctx, admin, probePodIn(ns, node, name, append([]string{"fetch"}, urls...)...), 3*time.Minute)
		if p == nil || (err != nil && podEnd(p) != corev1.PodFailed) {
			t.Fatalf("pod %s/%s: %v", ns, name, err)
		}
		return terminationMessage(p), err == nil
	}
	// A pod expected to reach its targets tries each again until it answers
	// (patience): its first packets are dropped while its own address has not yet
	// reached the node's agent through the apiserver, as docs/tenants.md says, which
	// on a loaded emulated node has taken longer than TCP's retries within one try. A
	// pod expected to be refused tries once, and must time out.
	expect := func(what, ns, name string, reach bool, urls ...string) string {
		if reach {
			urls = append([]string{"--patience", reachPatience.String()}, urls...)
		}
		report, ok := fetch(ns, name, urls...)
		switch {
		case ok != reach:
			t.Errorf("%s: reached %v, want %v:\n%s", what, ok, reach, report)
		case !reach && !dropped(report):
			t.Errorf("%s: refused, but not dropped (a NetworkPolicy drops; this failed another way):\n%s", what, report)
		default:
			t.Logf("%s: reached %v, as wanted", what, reach)
		}
		return report
	}

	expect("alpha → alpha (the positive control)", "alpha", "np-alpha-to-alpha", true, url(a1))
	expect("beta → alpha", "beta", "np-beta-to-alpha", false, url(a1))
	expect("alpha → beta (beta's allowFrom)", "alpha", "np-alpha-to-beta", true, url(b1))
	if _, err := runPodToEnd(ctx, admin, probePodIn("alpha", node, "np-alpha-dns", "resolve", "kubernetes.default"), 3*time.Minute); err != nil {
		t.Errorf("alpha → the cluster DNS: %v", err)
	}
	// The first packet's cost: from default, which no policy selects, to b1 (beta's
	// policy selects it and lets default in: judged in user space) and to a pod no
	// policy selects (never queued), alternately.
	var urls []string
	for range connectSamples {
		urls = append(urls, url(b1), url(open))
	}
	report := expect("default → beta (allowFrom), and → a pod no policy selects", metav1.NamespaceDefault, "np-connect-times", true, urls...)
	logConnectTimes(t, report, url(b1), url(open))
	policyChangeToEnforced(t, ctx, admin, node, a1)

	// Removing alpha's policy lets beta in.
	if err := admin.NetworkingV1().NetworkPolicies("alpha").Delete(ctx, tenants.NetworkPolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("beta → alpha, alpha's policy removed", "beta", "np-beta-to-alpha-open", true, url(a1))
}

// dropped reports whether every URL of a `probe fetch` report that failed timed out
// (the probe gives each 10 s), as a dropped connection does; a refusal, a reset or an
// unreachable route is another failure.
func dropped(report string) bool {
	failed := 0
	for line := range strings.SplitSeq(report, "\n") {
		if !strings.Contains(line, " error: ") {
			continue
		}
		failed++
		if !strings.Contains(line, "context deadline exceeded") && !strings.Contains(line, "i/o timeout") {
			return false
		}
	}
	return failed > 0
}

var fetchLine = regexp.MustCompile(`(?m)^(\S+) \d{3} .* connect=(\S+)$`)

// Names of the NetworkPolicy figures (test/bench/node.sh reads them).
const (
	figPolicyConnect = "TCP connect to a policy-selected pod (judged in user space)"
	figOpenConnect   = "TCP connect to a pod no policy selects (peer)"
	figPolicyDeleted = "NetworkPolicy deleted -> new connections pass"
	figPolicyCreated = "NetworkPolicy created -> new connections dropped"
)

// logConnectTimes logs the connect times in a `probe fetch` report, to policy (a
// policy-selected pod) and to open (one no policy selects), as figures.
func logConnectTimes(t *testing.T, report, policy, open string) {
	t.Helper()
	times := map[string][]time.Duration{}
	var rows [][2]string
	for _, m := range fetchLine.FindAllStringSubmatch(report, -1) {
		d, err := time.ParseDuration(m[2])
		if err != nil {
			continue
		}
		times[m[1]] = append(times[m[1]], d)
		name := map[string]string{policy: figPolicyConnect, open: figOpenConnect}[m[1]]
		rows = append(rows, [2]string{name, fmt.Sprintf("%.6f", d.Seconds())})
	}
	if len(times[policy]) != connectSamples || len(times[open]) != connectSamples {
		t.Errorf("connect times: %d and %d samples, want %d each, from:\n%s", len(times[policy]), len(times[open]), connectSamples, strings.TrimSpace(report))
		return
	}
	pm, om := median(times[policy]), median(times[open])
	t.Logf("TCP connect, new connections from one pod: medians %v to a policy-selected pod, %v to a pod no policy selects (ratio %.2f)",
		pm, om, float64(pm)/float64(om))
	logFigures(t, rows)
}

var flipLine = regexp.MustCompile(`(?m)^flip \d+: deleted -> passing (\S+), created -> dropped (\S+)$`)

// logFlips turns `probe flip`'s report into figures.
func logFlips(t *testing.T, report string) {
	t.Helper()
	var rows [][2]string
	for _, m := range flipLine.FindAllStringSubmatch(report, -1) {
		for i, name := range []string{figPolicyDeleted, figPolicyCreated} {
			if d, err := time.ParseDuration(m[i+1]); err == nil {
				rows = append(rows, [2]string{name, fmt.Sprintf("%.6f", d.Seconds())})
			}
		}
	}
	if len(rows) != 2*policyFlips {
		t.Errorf("probe flip reported %d figures, want %d:\n%s", len(rows), 2*policyFlips, report)
		return
	}
	logFigures(t, rows)
}

// median is the middle of xs (the upper middle of an even count; zero when empty).
func median[T cmp.Ordered](xs []T) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// policyChangeToEnforced measures, from a pod in default (which alpha's policy keeps
// out), how long deleting alpha's policy takes to let new connections to a1 pass and
// creating it again to drop them (`probe flip`, in the pod's one clock, as the pod's
// service account with a Role in alpha for NetworkPolicies), and logs the figures.
func policyChangeToEnforced(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, a1 *corev1.Pod) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "np-flip", Namespace: "alpha"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "create", "delete"}}}}
	if _, err := admin.RbacV1().Roles("alpha").Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "np-flip", Namespace: "alpha"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "np-flip"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: metav1.NamespaceDefault, Name: "default"}}}
	if _, err := admin.RbacV1().RoleBindings("alpha").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := runPodToEnd(ctx, admin, probePod(node, "np-flip", "flip", a1.Status.PodIP+":8080", "alpha", tenants.NetworkPolicyName, fmt.Sprint(policyFlips)), 5*time.Minute)
	if err != nil {
		t.Errorf("policy change -> enforced: %v\n%s", err, terminationMessage(p))
		return
	}
	t.Logf("policy change -> enforced on the node (TCG guest; each an upper bound: a try every 50 ms, cut off at 900 ms, dropped once every try timed out for 2 s), %d flips:\n%s",
		policyFlips, strings.TrimSpace(terminationMessage(p)))
	logFlips(t, terminationMessage(p))
}

// policyFlips is how many times policyChangeToEnforced deletes and recreates the policy.
const policyFlips = 5

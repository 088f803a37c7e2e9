package clusterdns_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// TestInitAppliesClusterDNS checks, on a control plane that controlplane.Init
// started, that the CoreDNS objects exist as the JoinBundle's cluster DNS address
// needs them, that the controllers accept the Deployment (its ReplicaSet creates
// both pods: service account, priority class and sysctl pass admission), and
// that applying them again, as a second init does, changes nothing.
func TestInitAppliesClusterDNS(t *testing.T) {
	c := testcluster.Shared(t)
	cs := c.Clientset(t)
	ctx := ctxFor(t, 2*time.Minute)
	ns := clusterdns.Namespace

	if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, clusterdns.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("service account: %v", err)
	}
	role, err := cs.RbacV1().ClusterRoles().Get(ctx, clusterdns.ClusterRole, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cluster role: %v", err)
	}
	if !reflect.DeepEqual(role.Rules, clusterdns.Role().Rules) {
		t.Errorf("cluster role rules %+v", role.Rules)
	}
	binding, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, clusterdns.ClusterRole, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cluster role binding: %v", err)
	}
	if binding.RoleRef.Name != clusterdns.ClusterRole || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Kind != "ServiceAccount" || binding.Subjects[0].Namespace != ns || binding.Subjects[0].Name != "coredns" {
		t.Errorf("cluster role binding %+v %+v", binding.RoleRef, binding.Subjects)
	}

	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, clusterdns.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("configmap: %v", err)
	}
	want, err := clusterdns.Corefile(clusterdns.InCluster(c.Config.Networking.DNSDomain))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["Corefile"] != want {
		t.Errorf("Corefile in the ConfigMap:\n%s\nwant:\n%s", cm.Data["Corefile"], want)
	}

	svc, err := cs.CoreV1().Services(ns).Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kube-dns service: %v", err)
	}
	// The address kubelet gets as clusterDNS: the tenth of the service subnet.
	subnet := netip.MustParsePrefix(c.Config.Networking.ServiceSubnet)
	tenth := subnet.Masked().Addr()
	for range 10 {
		tenth = tenth.Next()
	}
	if svc.Spec.ClusterIP != tenth.String() || svc.Spec.ClusterIP != joinconfig.ClusterDNS(c.Config) {
		t.Errorf("kube-dns ClusterIP %s, want %s (tenth address of %s)", svc.Spec.ClusterIP, tenth, subnet)
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, p.Name+"/"+string(p.Protocol)+"/"+p.TargetPort.String())
		if p.Name != "metrics" && p.Port != 53 {
			t.Errorf("kube-dns port %s is %d, want 53", p.Name, p.Port)
		}
	}
	if !slices.Equal(ports, []string{"dns/UDP/53", "dns-tcp/TCP/53", "metrics/TCP/9153"}) {
		t.Errorf("kube-dns ports %v", ports)
	}
	if svc.Spec.Selector["k8s-app"] != "kube-dns" {
		t.Errorf("kube-dns selector %v", svc.Spec.Selector)
	}

	dep, err := cs.AppsV1().Deployments(ns).Get(ctx, clusterdns.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("deployment: %v", err)
	}
	pod := dep.Spec.Template.Spec
	if *dep.Spec.Replicas != 2 || len(pod.Containers) != 1 {
		t.Fatalf("deployment: %d replicas, %d containers", *dep.Spec.Replicas, len(pod.Containers))
	}
	ctr := pod.Containers[0]
	if ctr.Image != "gpurack.io/coredns:"+clusterdns.Version || ctr.ImagePullPolicy != corev1.PullNever {
		t.Errorf("container image %s, pull policy %s", ctr.Image, ctr.ImagePullPolicy)
	}
	if r := ctr.ReadinessProbe; r == nil || r.HTTPGet == nil || r.HTTPGet.Path != "/ready" || r.HTTPGet.Port.IntValue() != 8181 {
		t.Errorf("readiness probe %+v", r)
	}
	if pod.ServiceAccountName != "coredns" || pod.DNSPolicy != corev1.DNSDefault || pod.Volumes[0].ConfigMap.Name != "coredns" {
		t.Errorf("pod: service account %q, dns policy %s, volume %+v", pod.ServiceAccountName, pod.DNSPolicy, pod.Volumes[0])
	}
	for _, taint := range []corev1.Taint{
		{Key: nodecontract.TaintUnvalidated, Effect: corev1.TaintEffectNoSchedule},
		{Key: nodecontract.TaintGPUUnhealthy, Effect: corev1.TaintEffectNoSchedule},
		{Key: nodecontract.TaintGPUUnhealthy, Effect: corev1.TaintEffectNoExecute},
	} {
		if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(&taint) }) {
			t.Errorf("the pods do not tolerate %s:%s", taint.Key, taint.Effect)
		}
	}

	// The ReplicaSet controller creates both pods (Pending: this cluster has no
	// nodes), so the pod spec passes admission.
	var pods *corev1.PodList
	for {
		pods, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		if err == nil && len(pods.Items) == 2 {
			break
		}
		if ctx.Err() != nil {
			events, _ := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			t.Fatalf("the deployment's pods were not created (%v, %d pods); events: %+v", err, len(pods.Items), events.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range pods.Items {
		if p.Spec.Containers[0].Image != clusterdns.Image || p.Spec.PriorityClassName != "system-cluster-critical" || p.Spec.Priority == nil {
			t.Errorf("pod %s: image %s, priority class %q", p.Name, p.Spec.Containers[0].Image, p.Spec.PriorityClassName)
		}
	}

	// A second apply (what `init` on a running control plane does) changes nothing.
	objs, err := clusterdns.Objects(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(c.RESTConfig(t))
	versions := func() map[string]string {
		m := map[string]string{}
		for _, o := range objs {
			ri := dyn.Resource(o.GVR)
			var got *unstructured.Unstructured
			name := objectName(t, o)
			if o.GVR.Resource == "clusterroles" || o.GVR.Resource == "clusterrolebindings" {
				got, err = ri.Get(ctx, name, metav1.GetOptions{})
			} else {
				got, err = ri.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			}
			if err != nil {
				t.Fatalf("%s: %v", o.Name(), err)
			}
			m[o.Name()] = got.GetResourceVersion()
			if o.GVR.Resource == "deployments" {
				// Its controller writes status; a changed spec bumps the generation.
				m[o.Name()] = fmt.Sprint("generation ", got.GetGeneration())
			}
		}
		return m
	}
	before := versions()
	if err := joinconfig.Apply(ctx, dyn, objs); err != nil {
		t.Fatal(err)
	}
	if after := versions(); !reflect.DeepEqual(before, after) {
		t.Errorf("applying the cluster DNS objects again changed them: resource versions %v, then %v", before, after)
	}
}

func objectName(t *testing.T, o joinconfig.Object) string {
	t.Helper()
	m, ok := o.Obj.(metav1.Object)
	if !ok {
		t.Fatalf("%T has no object metadata", o.Obj)
	}
	return m.GetName()
}

package clusterdns_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterdns"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestCoreDNSResolvesClusterNames runs the CoreDNS that `make coredns-image` packs
// (images/coredns, built here) on loopback with the cluster's Corefile, as the
// coredns ServiceAccount (a token the apiserver issues for it, so the ClusterRole
// init binds is all it has), against the real apiserver. A real DNS client then
// resolves the kubernetes Service, a new ClusterIP Service, a headless Service's
// EndpointSlice address, a name outside the cluster through the forward plugin,
// and gets NXDOMAIN for a Service that does not exist.
func TestCoreDNSResolvesClusterNames(t *testing.T) {
	testreq.Short(t, "builds CoreDNS")
	testreq.Tool(t, "go", "install Go")
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	ctx := ctxFor(t, 5*time.Minute)
	dir := t.TempDir()

	binary := filepath.Join(dir, "coredns")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", binary, ".")
	build.Dir = filepath.Join("..", "..", "images", "coredns")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build images/coredns: %v\n%s", err, out)
	}
	out, err := exec.Command(binary, "-plugins").Output()
	if err != nil {
		t.Fatalf("coredns -plugins: %v", err)
	}
	plugins := strings.Fields(string(out))
	for _, p := range []string{"kubernetes", "forward", "cache", "ready", "health", "loop", "reload", "bind", "prometheus"} {
		if !slices.Contains(plugins, p) {
			t.Errorf("coredns -plugins lacks %s: %v", p, plugins)
		}
	}
	for _, p := range []string{"etcd", "route53", "file", "hosts"} {
		if slices.Contains(plugins, p) {
			t.Errorf("coredns carries the plugin %s, which the cluster does not use: %v", p, plugins)
		}
	}

	kubeconfig := serviceAccountKubeconfig(t, ctx, c, admin, filepath.Join(dir, "coredns.kubeconfig"))
	upstream := startUpstream(t)
	ports, err := testcluster.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	cf := clusterdns.InCluster(c.Config.Networking.DNSDomain)
	cf.Port, cf.Bind = ports[0], "127.0.0.1"
	cf.Health, cf.Ready, cf.Metrics = addr(ports[1]), addr(ports[2]), addr(ports[3])
	cf.Upstream, cf.Kubeconfig = []string{upstream}, kubeconfig
	corefile, err := clusterdns.Corefile(cf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(binary, "-conf", filepath.Join(dir, "Corefile"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("coredns output:\n%s", logs.String())
		}
	})

	// /ready answers 200 once the kubernetes plugin has listed what it watches:
	// what the Deployment's readiness probe asks.
	waitReady(t, ctx, "http://"+cf.Ready+"/ready", exited)

	ns := "dnstest"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	web, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 5432}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port, proto, ready := int32(5432), corev1.ProtocolTCP, true
	if _, err := admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "db-1", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.7.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kube, err := admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	server := addr(cf.Port)
	domain := c.Config.Networking.DNSDomain
	for _, q := range []struct{ name, want string }{
		{"kubernetes.default.svc." + domain + ".", kube.Spec.ClusterIP},
		{"web." + ns + ".svc." + domain + ".", web.Spec.ClusterIP},
		{"db." + ns + ".svc." + domain + ".", "10.244.7.9"},
		{"outside.example.", "192.0.2.7"},
	} {
		for _, network := range []string{"udp", "tcp"} {
			got := resolveA(t, ctx, network, server, q.name, exited)
			if !slices.Equal(got, []string{q.want}) {
				t.Errorf("%s over %s: %v, want [%s]", q.name, network, got, q.want)
			} else {
				t.Logf("%s over %s: %s", q.name, network, got[0])
			}
		}
	}
	m := new(dns.Msg)
	m.SetQuestion("missing."+ns+".svc."+domain+".", dns.TypeA)
	r, err := dns.ExchangeContext(ctx, m, server)
	if err != nil || r.Rcode != dns.RcodeNameError {
		t.Errorf("a Service that does not exist: %v %v, want NXDOMAIN", r, err)
	}
	// The kubernetes plugin answers the cluster's reverse zone too.
	m = new(dns.Msg)
	m.SetQuestion(mustReverse(t, web.Spec.ClusterIP), dns.TypePTR)
	if r, err := dns.ExchangeContext(ctx, m, server); err != nil || len(r.Answer) != 1 ||
		r.Answer[0].(*dns.PTR).Ptr != "web."+ns+".svc."+domain+"." {
		t.Errorf("PTR of %s: %v %v", web.Spec.ClusterIP, r, err)
	}
	resp, err := http.Get("http://" + cf.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := new(bytes.Buffer)
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(body.String(), "coredns_dns_requests_total") {
		t.Errorf("/metrics has no coredns_dns_requests_total")
	}
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func mustReverse(t *testing.T, ip string) string {
	t.Helper()
	r, err := dns.ReverseAddr(ip)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// serviceAccountKubeconfig writes a kubeconfig with a token the apiserver issues
// for kube-system/coredns, and checks the identity is narrow: it cannot read
// Secrets nor change a Service.
func serviceAccountKubeconfig(t *testing.T, ctx context.Context, c *testcluster.Cluster, admin kubernetes.Interface, path string) string {
	t.Helper()
	ttl := int64(3600)
	tok, err := admin.CoreV1().ServiceAccounts(clusterdns.Namespace).CreateToken(ctx, clusterdns.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the coredns service account: %v", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.CAPEM}
	kc.AuthInfos["coredns"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "coredns"}
	kc.CurrentContext = "c"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(&rest.Config{Host: c.Server, BearerToken: tok.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM}})
	if _, err := cs.CoreV1().Secrets(clusterdns.Namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the coredns service account listing Secrets: %v, want Forbidden", err)
	}
	if err := cs.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("the coredns service account deleting a Service: %v, want Forbidden", err)
	}
	return path
}

// startUpstream serves outside.example. A 192.0.2.7 on a loopback port, the
// resolver the forward plugin sends names outside the cluster to.
func startUpstream(t *testing.T) string {
	t.Helper()
	// One port for UDP and TCP: the UDP port the kernel picks may be taken for TCP
	// by another test running in parallel, so try again with another.
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			t.Fatalf("no port free for both UDP and TCP after %d tries: %v", try+1, err)
		}
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Name == "outside.example." && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR("outside.example. 60 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go s.ActivateAndServe()
		t.Cleanup(func() { s.Shutdown() })
	}
	return pc.LocalAddr().String()
}

func waitReady(t *testing.T, ctx context.Context, url string, exited <-chan error) {
	t.Helper()
	var last string
	for {
		select {
		case err := <-exited:
			t.Fatalf("coredns exited before it was ready: %v", err)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if ctx.Err() != nil {
			t.Fatalf("coredns not ready at %s: %s", url, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// resolveA asks server for name's A records until it has an answer (the
// kubernetes plugin learns a new Service from its watch).
func resolveA(t *testing.T, ctx context.Context, network, server, name string, exited <-chan error) []string {
	t.Helper()
	client := &dns.Client{Net: network, Timeout: 2 * time.Second}
	var last string
	for {
		select {
		case err := <-exited:
			t.Fatalf("coredns exited: %v", err)
		default:
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := client.ExchangeContext(ctx, m, server)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			var ips []string
			for _, rr := range r.Answer {
				if a, ok := rr.(*dns.A); ok {
					ips = append(ips, a.A.String())
				}
			}
			return ips
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		if ctx.Err() != nil {
			t.Fatalf("%s over %s: %s", name, network, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package controlplane_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// A control plane whose leaves are issued for 30 minutes reports them so; `certs renew
// all` issues them again for two hours, restarts every component in start order through
// the supervisor's socket (as for `init --foreground`), and afterwards kube-apiserver
// serves the new certificate and admin.conf still lists namespaces. It has a private
// control plane: renewing restarts every component, which the shared one's tests rely on.
func TestRenewCertificatesOnRunningControlPlane(t *testing.T) {
	testcluster.Require(t)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	cp, err := controlplane.Init(ctxFor(t, 3*time.Minute), controlplane.Options{
		Dir: dir, Config: cfg, WritePIDFile: true, LeafValidity: 30 * time.Minute, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	before := checkExpiration(t, dir, 30*time.Minute)
	pool := x509.NewCertPool()
	pool.AddCert(cp.PKI.CA.Cert)
	apiserver := "127.0.0.1:" + strconv.Itoa(cfg.APIServer.Port)
	oldServed, err := controlplane.ServedCertificate(ctxFor(t, 10*time.Second), apiserver, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(oldServed.NotAfter); left > 30*time.Minute {
		t.Fatalf("kube-apiserver serves a certificate valid for %s, not the 30 minutes init was given", left)
	}
	pids := map[string]int{}
	for _, n := range components.Names {
		pids[n] = cp.Supervisor.PID(n)
	}

	var out bytes.Buffer
	began := time.Now()
	res, err := controlplane.RenewCertificates(ctxFor(t, 5*time.Minute), dir, controlplane.RenewOptions{
		Names: []string{clusterpki.RenewAll}, Validity: 2 * time.Hour, Out: &out,
	})
	t.Logf("certs renew all (%s):\n%s", time.Since(began).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Restarted, components.Names) {
		t.Errorf("restarted %v, want every component in start order %v", res.Restarted, components.Names)
	}
	text := out.String()
	if i, j := strings.Index(text, "etcd restarted"), strings.Index(text, "kube-apiserver restarted"); i < 0 || j < i {
		t.Errorf("etcd was not restarted before kube-apiserver:\n%s", text)
	}
	for _, n := range components.Names {
		if cp.Supervisor.PID(n) == pids[n] {
			t.Errorf("%s still runs as pid %d", n, pids[n])
		}
	}

	newServed, err := controlplane.ServedCertificate(ctxFor(t, 10*time.Second), apiserver, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	if !newServed.NotAfter.After(oldServed.NotAfter.Add(80*time.Minute)) || newServed.SerialNumber.Cmp(oldServed.SerialNumber) == 0 {
		t.Errorf("kube-apiserver serves NotAfter %s (serial %x), before the renewal %s (serial %x)",
			newServed.NotAfter, newServed.SerialNumber, oldServed.NotAfter, oldServed.SerialNumber)
	}
	after := checkExpiration(t, dir, 2*time.Hour)
	for _, name := range []string{"controller-manager-serving", "scheduler-serving"} {
		if after[name].Serial == before[name].Serial {
			t.Errorf("%s was not made again by its component", name)
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, clusterpki.AdminKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	nss, err := cs.CoreV1().Namespaces().List(ctxFor(t, 30*time.Second), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("admin.conf after the renewal: %v", err)
	}
	if !slices.ContainsFunc(nss.Items, func(ns corev1.Namespace) bool { return ns.Name == "kube-system" }) {
		t.Errorf("namespaces with the renewed admin.conf: %d, no kube-system", len(nss.Items))
	}
	for _, h := range cp.Probe(ctxFor(t, 30*time.Second)) {
		if !h.OK {
			t.Errorf("after the renewal: %s", h)
		}
	}
}

// checkExpiration runs the check-expiration report of dir and checks that every leaf
// that init issues has about validity left, the components' own serving certificates
// about a year and the CAs about ten years. It returns the entries by name.
func checkExpiration(t *testing.T, dir string, validity time.Duration) map[string]clusterpki.Expiry {
	t.Helper()
	r, err := clusterpki.CheckExpiration(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	byName := map[string]clusterpki.Expiry{}
	for _, e := range r.Certificates {
		byName[e.Name] = e
		want, slack := validity, time.Minute
		if strings.HasSuffix(e.Name, "-serving") {
			want, slack = 365*24*time.Hour, 24*time.Hour
		}
		if e.Missing || e.Problem != "" || e.ExternallyManaged {
			t.Errorf("%s: %+v", e.Name, e)
		}
		if left := e.Residual(now); left > want || left < want-slack {
			t.Errorf("%s: %s left, want about %s", e.Name, left.Round(time.Second), want)
		}
	}
	for _, a := range r.Authorities {
		if left := a.Residual(now); left < 9*365*24*time.Hour {
			t.Errorf("CA %s: %s left", a.Name, left)
		}
	}
	var table bytes.Buffer
	r.WriteTable(&table, now)
	t.Logf("certs check-expiration:\n%s", table.String())
	return byName
}

package clusterpki

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/pki"
)

// clusterDir makes what init writes before it starts anything: the PKI with leaves
// valid for validity, and the four kubeconfigs.
func clusterDir(t *testing.T, validity time.Duration) (string, *Set) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cluster")
	set, err := EnsureValidity(filepath.Join(dir, PKIDirName), config(t, "nodeName: cp-1\n"), validity)
	if err != nil {
		t.Fatal(err)
	}
	for _, kc := range []struct{ file, user string }{
		{AdminKubeconfig, AdminUser}, {ControllerManagerKubeconfig, ControllerManagerUser}, {SchedulerKubeconfig, SchedulerUser},
		{KubeStateMetricsKubeconfig, KubeStateMetricsUser}, {KueueKubeconfig, KueueUser},
	} {
		if err := set.EnsureKubeconfig(filepath.Join(dir, kc.file), "test", "https://127.0.0.1:6443", kc.user); err != nil {
			t.Fatal(err)
		}
	}
	return dir, set
}

// selfSignedServing writes what kube-controller-manager writes into its --cert-dir: a
// leaf and the throwaway CA that signed it, in one file.
func selfSignedServing(t *testing.T, dir string) {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "localhost-ca@1", Validity: 365 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.CertRequest{CommonName: "localhost@1", DNSNames: []string{"localhost"}, Usages: []pki.Usage{pki.ServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := pki.EncodeKeyPEM(kp.Key)
	base := filepath.Join(dir, PKIDirName, ControllerManagerServingDir)
	os.MkdirAll(base, 0o700)
	os.WriteFile(filepath.Join(base, "kube-controller-manager.crt"), append(pki.EncodeCertPEM(kp.Cert), pki.EncodeCertPEM(ca.Cert)...), 0o644)
	os.WriteFile(filepath.Join(base, "kube-controller-manager.key"), keyPEM, 0o600)
}

func find(t *testing.T, es []Expiry, name string) Expiry {
	t.Helper()
	for _, e := range es {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("%s is not in the report", name)
	return Expiry{}
}

func TestCheckExpirationListsEveryCertificateAndCA(t *testing.T) {
	dir, _ := clusterDir(t, 30*time.Minute)
	selfSignedServing(t, dir)
	enroller := filepath.Join(t.TempDir(), "enroller.kubeconfig")
	set, err := Load(filepath.Join(dir, PKIDirName))
	if err != nil {
		t.Fatal(err)
	}
	set.LeafValidity = 30 * time.Minute
	if err := set.EnsureKubeconfig(enroller, "test", "https://127.0.0.1:6443", "gpurack:enroller"); err != nil {
		t.Fatal(err)
	}
	r, err := CheckExpiration(dir, enroller)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if len(r.Certificates) != len(Certificates)+1 || len(r.Authorities) != 3 {
		t.Fatalf("%d certificates and %d CAs, want %d and 3", len(r.Certificates), len(r.Authorities), len(Certificates)+1)
	}
	wantCA := map[string]string{
		"admin.conf": "ca", "apiserver": "ca", "apiserver-etcd-client": "etcd-ca", "apiserver-kubelet-client": "ca",
		"controller-manager.conf": "ca", "controller-manager-serving": "self-signed", "etcd-healthcheck-client": "etcd-ca",
		"etcd-peer": "etcd-ca", "etcd-server": "etcd-ca", "front-proxy-client": "front-proxy-ca", "kube-state-metrics.conf": "ca", "kueue.conf": "ca", "kueue-webhook": "ca", "logs-gateway": "ca", "monitoring-client": "ca", "registry": "ca", "scheduler.conf": "ca",
		"enroller.kubeconfig": "ca",
	}
	for _, e := range r.Certificates {
		if e.Name == "scheduler-serving" {
			if !e.Missing {
				t.Errorf("scheduler-serving: %+v, want missing (the scheduler never ran)", e)
			}
			continue
		}
		if e.Missing || e.Problem != "" || e.ExternallyManaged {
			t.Errorf("%s: %+v", e.Name, e)
		}
		if e.Authority != wantCA[e.Name] {
			t.Errorf("%s: signed by %q, want %q", e.Name, e.Authority, wantCA[e.Name])
		}
		res := e.Residual(now)
		if e.Name == "controller-manager-serving" {
			continue
		}
		if res < 29*time.Minute || res > 30*time.Minute {
			t.Errorf("%s: residual %s, want about 30m", e.Name, res)
		}
		if got := FormatResidual(res); got != "29m" {
			t.Errorf("%s: residual printed %q, want 29m", e.Name, got)
		}
	}
	if e := find(t, r.Certificates, "apiserver"); e.CommonName != "kube-apiserver" || !strings.HasSuffix(e.File, "/pki/apiserver.crt") {
		t.Errorf("apiserver: %+v", e)
	}
	if e := find(t, r.Certificates, "admin.conf"); e.CommonName != AdminUser || e.File != filepath.Join(dir, "admin.conf") {
		t.Errorf("admin.conf: %+v", e)
	}
	for _, a := range r.Authorities {
		if res := a.Residual(now); a.Missing || res < 9*365*24*time.Hour || FormatResidual(res) != "9y" {
			t.Errorf("CA %s: %+v, residual %s", a.Name, a, res)
		}
	}

	// Without the etcd CA's key, kubeadm calls that CA and its leaves externally managed.
	os.Remove(filepath.Join(dir, PKIDirName, EtcdCAKey))
	r, err = CheckExpiration(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"etcd-server", "etcd-peer", "apiserver-etcd-client"} {
		if !find(t, r.Certificates, name).ExternallyManaged {
			t.Errorf("%s is not externally managed although etcd/ca.key is gone", name)
		}
	}
	if !find(t, r.Authorities, EtcdCAName).ExternallyManaged || find(t, r.Authorities, ClusterCAName).ExternallyManaged {
		t.Errorf("CAs: %+v", r.Authorities)
	}
	if find(t, r.Certificates, "apiserver").ExternallyManaged {
		t.Error("apiserver is externally managed although ca.key is there")
	}
}

func TestCheckExpirationFlagsBrokenFiles(t *testing.T) {
	dir, _ := clusterDir(t, 0)
	pkiDir := filepath.Join(dir, PKIDirName)
	os.WriteFile(filepath.Join(pkiDir, FrontProxyClientCert), []byte("not a certificate"), 0o644)
	// A pair torn apart: another pair's key beside apiserver.crt.
	other, _ := os.ReadFile(filepath.Join(pkiDir, APIServerKubeletKey))
	os.WriteFile(filepath.Join(pkiDir, APIServerKey), other, 0o600)
	os.Remove(filepath.Join(dir, SchedulerKubeconfig))
	r, err := CheckExpiration(dir)
	if err != nil {
		t.Fatal(err)
	}
	if e := find(t, r.Certificates, "front-proxy-client"); !strings.Contains(e.Problem, "no PEM CERTIFICATE block") {
		t.Errorf("garbage front-proxy-client.crt: %+v", e)
	}
	if e := find(t, r.Certificates, "apiserver"); !strings.Contains(e.Problem, "do not match") || e.NotAfter.IsZero() {
		t.Errorf("apiserver with another key: %+v", e)
	}
	if e := find(t, r.Certificates, SchedulerKubeconfig); !e.Missing {
		t.Errorf("removed scheduler.conf: %+v", e)
	}
	var out bytes.Buffer
	r.WriteTable(&out, time.Now())
	for _, want := range []string{"!INVALID! front-proxy-client", "!INVALID! apiserver ", "!MISSING! scheduler.conf", "unreadable:\n  apiserver: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCheckExpirationOfNoControlPlane(t *testing.T) {
	dir := t.TempDir()
	_, err := CheckExpiration(dir)
	if err == nil || !strings.Contains(err.Error(), "is not a control-plane directory") || !strings.Contains(err.Error(), "pki/ca.crt") {
		t.Fatalf("check-expiration of an empty directory: %v", err)
	}
}

func TestWriteTableAndJSON(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := ExpirationReport{
		Certificates: []Expiry{
			{Name: "admin.conf", File: "/c/admin.conf", CommonName: "kubernetes-admin", Serial: "ab", NotAfter: now.Add(364*24*time.Hour + time.Hour), Authority: "ca"},
			{Name: "apiserver", File: "/c/pki/apiserver.crt", CommonName: "kube-apiserver", NotAfter: now.Add(-time.Hour), Authority: "ca"},
			{Name: "etcd-server", File: "/c/pki/etcd/server.crt", CommonName: "cp-1", NotAfter: now.Add(90 * time.Minute), Authority: "etcd-ca", ExternallyManaged: true},
			{Name: "scheduler-serving", File: "/c/pki/scheduler-serving/kube-scheduler.crt", Missing: true},
		},
		Authorities: []Expiry{
			{Name: "ca", File: "/c/pki/ca.crt", CommonName: "kubernetes", NotAfter: now.Add(9*365*24*time.Hour + 48*time.Hour)},
		},
	}
	var out bytes.Buffer
	if err := r.WriteTable(&out, now); err != nil {
		t.Fatal(err)
	}
	want := `CERTIFICATE                   EXPIRES                  RESIDUAL TIME   CERTIFICATE AUTHORITY   EXTERNALLY MANAGED   COMMON NAME        FILE
admin.conf                    Feb 28, 2027 13:00 UTC   364d            ca                      no                   kubernetes-admin   /c/admin.conf
apiserver                     Mar 01, 2026 11:00 UTC   EXPIRED         ca                      no                   kube-apiserver     /c/pki/apiserver.crt
etcd-server                   Mar 01, 2026 13:30 UTC   1h              etcd-ca                 yes                  cp-1               /c/pki/etcd/server.crt
!MISSING! scheduler-serving                                                                    no                                      /c/pki/scheduler-serving/kube-scheduler.crt

CERTIFICATE AUTHORITY   EXPIRES                  RESIDUAL TIME   EXTERNALLY MANAGED   COMMON NAME   FILE
ca                      Mar 01, 2035 12:00 UTC   9y              no                   kubernetes    /c/pki/ca.crt
`
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	data, err := r.JSON(now)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Certificates []map[string]any `json:"certificates"`
		Authorities  []map[string]any `json:"certificateAuthorities"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(got.Certificates) != 4 || len(got.Authorities) != 1 {
		t.Fatalf("JSON:\n%s", data)
	}
	checks := []struct {
		entry map[string]any
		key   string
		want  any
	}{
		{got.Certificates[0], "residualTime", float64(365*24*3600 - 23*3600)},
		{got.Certificates[0], "expirationDate", "2027-02-28T13:00:00Z"},
		{got.Certificates[0], "caName", "ca"},
		{got.Certificates[0], "serial", "ab"},
		{got.Certificates[1], "residualTime", float64(-3600)},
		{got.Certificates[2], "externallyManaged", true},
		{got.Certificates[3], "missing", true},
		{got.Certificates[3], "expirationDate", nil},
		{got.Authorities[0], "name", "ca"},
	}
	for _, c := range checks {
		if c.entry[c.key] != c.want {
			t.Errorf("%v: %s = %v, want %v", c.entry["name"], c.key, c.entry[c.key], c.want)
		}
	}
}

// snapshot returns every file under dir with its content, to show that a refused
// renewal wrote nothing.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		files[p] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

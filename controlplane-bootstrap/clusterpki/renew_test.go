package clusterpki

import (
	"bytes"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/internal/pki"
)

// oldCerts reads the leaf of every non-self-signed certificate in dir by name.
func oldCerts(t *testing.T, dir string) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for _, c := range Certificates {
		if c.Kind == SelfSigned {
			continue
		}
		var data []byte
		var err error
		if c.Kind == KubeconfigCert {
			data, err = kubeconfigClientCert(filepath.Join(dir, c.Cert))
		} else {
			data, err = os.ReadFile(filepath.Join(dir, c.Cert))
		}
		if err != nil {
			t.Fatal(err)
		}
		if out[c.Name], err = pki.DecodeCertPEM(data); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestRenewAllKeepsSubjectSANsAndUsagesWithNewKeys(t *testing.T) {
	dir, set := clusterDir(t, 10*time.Minute)
	selfSignedServing(t, dir)
	before := oldCerts(t, dir)
	adminBefore, _ := clientcmd.LoadFromFile(filepath.Join(dir, AdminKubeconfig))
	r, err := PlanRenewal(dir, []string{RenewAll}, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Renewed) != len(Certificates) {
		t.Fatalf("renewed %d, want all %d", len(r.Renewed), len(Certificates))
	}
	if err := r.Write(); err != nil {
		t.Fatal(err)
	}
	after := oldCerts(t, dir)
	for name, old := range before {
		got := after[name]
		if got.SerialNumber.Cmp(old.SerialNumber) == 0 || bytes.Equal(got.RawSubjectPublicKeyInfo, old.RawSubjectPublicKeyInfo) {
			t.Errorf("%s: same serial or same key after renewal", name)
		}
		if !bytes.Equal(got.RawSubject, old.RawSubject) || !bytes.Equal(got.RawIssuer, old.RawIssuer) {
			t.Errorf("%s: subject %v issuer %v, was %v %v", name, got.Subject, got.Issuer, old.Subject, old.Issuer)
		}
		if !slices.Equal(got.DNSNames, old.DNSNames) || !slices.EqualFunc(got.IPAddresses, old.IPAddresses, net.IP.Equal) {
			t.Errorf("%s: SANs %v %v, were %v %v", name, got.DNSNames, got.IPAddresses, old.DNSNames, old.IPAddresses)
		}
		if !slices.Equal(got.ExtKeyUsage, old.ExtKeyUsage) {
			t.Errorf("%s: usages %v, were %v", name, got.ExtKeyUsage, old.ExtKeyUsage)
		}
		if left := time.Until(got.NotAfter); left < 119*time.Minute || left > 2*time.Hour {
			t.Errorf("%s: %s left after renewing for 2h", name, left)
		}
	}
	// Each pair still belongs together, and each kubeconfig still names the same
	// server and trusts the same CA.
	for _, c := range Certificates {
		if c.Kind == PKIPair {
			if _, err := pki.LoadKeyPair(filepath.Join(dir, c.Cert), filepath.Join(dir, c.Key)); err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
		}
		if c.Kind == SelfSigned {
			if _, err := os.Stat(filepath.Join(dir, c.Cert)); err == nil {
				t.Errorf("%s is still there; its component would keep serving it", c.Name)
			}
		}
	}
	adminAfter, err := clientcmd.LoadFromFile(filepath.Join(dir, AdminKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	if !set.kubeconfigCurrent(filepath.Join(dir, AdminKubeconfig), "https://127.0.0.1:6443", AdminUser) || adminAfter.CurrentContext != adminBefore.CurrentContext {
		t.Errorf("admin.conf after renewal no longer points at the server with a certificate of the CA")
	}
	if st, _ := os.Stat(filepath.Join(dir, PKIDirName, APIServerKey)); st.Mode().Perm() != 0o600 {
		t.Errorf("apiserver.key mode %v after renewal", st.Mode())
	}
	if !slices.Contains(r.Paths(), filepath.Join(dir, PKIDirName, EtcdServerCert)) || !slices.Contains(r.Paths(), filepath.Join(dir, SchedulerKubeconfig)) {
		t.Errorf("Paths() = %v", r.Paths())
	}
}

// A renewal torn between a pair's two files is flagged by check-expiration and
// repaired by renewing again.
func TestRenewRepairsATornPair(t *testing.T) {
	dir, _ := clusterDir(t, 0)
	oldCert, _ := os.ReadFile(filepath.Join(dir, PKIDirName, APIServerCert))
	r, err := PlanRenewal(dir, []string{"apiserver"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, PKIDirName, APIServerCert), oldCert, 0o644) // as if the cert's write was lost
	rep, _ := CheckExpiration(dir)
	if find(t, rep.Certificates, "apiserver").Problem == "" {
		t.Fatal("check-expiration does not flag a certificate beside another key")
	}
	r, err = PlanRenewal(dir, []string{"apiserver"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(); err != nil {
		t.Fatal(err)
	}
	rep, _ = CheckExpiration(dir)
	if e := find(t, rep.Certificates, "apiserver"); e.Problem != "" || FormatResidual(e.Residual(time.Now())) != "364d" {
		t.Errorf("after renewing again: %+v", e)
	}
}

func TestRenewRefusesBadInputAndWritesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string
		setup func(dir string)
		want  []string
	}{
		{"unknown name", []string{"apiserver", "apiserverr"}, nil,
			[]string{`unknown certificate "apiserverr"`, "valid names: all (alone), admin.conf, apiserver,", "scheduler-serving"}},
		{"all with others", []string{"all", "apiserver"}, nil, []string{`"all" renews every certificate and takes no other name`}},
		{"no names", nil, nil, []string{"name the certificates to renew", "etcd-peer"}},
		{"cluster CA key missing", []string{"etcd-server", "admin.conf"},
			func(dir string) { os.Remove(filepath.Join(dir, PKIDirName, CAKey)) },
			[]string{"cannot renew admin.conf", "CA ca: its key /", filepath.Join(PKIDirName, CAKey) + " is missing", "restore it from a backup", "nothing was written"}},
		{"etcd CA key unreadable", []string{"apiserver", "etcd-peer"},
			func(dir string) {
				p := filepath.Join(dir, PKIDirName, EtcdCAKey)
				os.Remove(p)
				os.Mkdir(p, 0o700) // reading a directory fails, even as root
			},
			[]string{"cannot renew etcd-peer", "CA etcd-ca: its key /", filepath.Join(PKIDirName, EtcdCAKey) + " cannot be read", "is a directory", "nothing was written"}},
		{"front-proxy CA key garbage", []string{"front-proxy-client"},
			func(dir string) {
				os.WriteFile(filepath.Join(dir, PKIDirName, FrontProxyCAKey), []byte("garbage"), 0o600)
			},
			[]string{"cannot renew front-proxy-client", FrontProxyCAKey + ": no PEM block found"}},
		{"certificate missing", []string{"apiserver", "scheduler.conf"},
			func(dir string) { os.Remove(filepath.Join(dir, SchedulerKubeconfig)) },
			[]string{"cannot renew scheduler.conf", "/scheduler.conf is missing", "run `controlplane-bootstrap init`"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := clusterDir(t, 0)
			if tc.setup != nil {
				tc.setup(dir)
			}
			before := snapshot(t, dir)
			r, err := PlanRenewal(dir, tc.names, 0)
			if err == nil {
				t.Fatalf("renewal of %v planned: %+v", tc.names, r.Renewed)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			after := snapshot(t, dir)
			if len(after) != len(before) {
				t.Errorf("%d files before, %d after", len(before), len(after))
			}
			for p, data := range before {
				if after[p] != data {
					t.Errorf("%s changed", p)
				}
			}
		})
	}
	if _, err := PlanRenewal(t.TempDir(), []string{RenewAll}, 0); err == nil || !strings.Contains(err.Error(), "is not a control-plane directory") {
		t.Errorf("renewal in an empty directory: %v", err)
	}
}

func TestRequestFromRefusesWhatItCannotIssue(t *testing.T) {
	ca, err := pki.NewCA(pki.CARequest{CommonName: "t"})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.CertRequest{CommonName: "x", Organizations: []string{"o"}, DNSNames: []string{"x.example"}, Usages: []pki.Usage{pki.ServerAuth, pki.ClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := RequestFrom(kp.Cert)
	if err != nil || req.CommonName != "x" || !slices.Equal(req.Organizations, []string{"o"}) || len(req.Usages) != 2 {
		t.Fatalf("RequestFrom: %+v %v", req, err)
	}
	c := *kp.Cert
	c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageCodeSigning)
	if _, err := RequestFrom(&c); err == nil || !strings.Contains(err.Error(), "renew it where it was made") {
		t.Errorf("a code-signing usage: %v", err)
	}
}

// Certificates already past their NotAfter renew like any other: renewal reads their
// names, not their validity.
func TestRenewExpiredCertificates(t *testing.T) {
	dir, _ := clusterDir(t, time.Second)
	time.Sleep(1500 * time.Millisecond)
	rep, _ := CheckExpiration(dir)
	var table bytes.Buffer
	rep.WriteTable(&table, time.Now())
	if !strings.Contains(table.String(), "EXPIRED") || find(t, rep.Certificates, "etcd-server").Residual(time.Now()) >= 0 {
		t.Fatalf("certificates issued for a second are not expired:\n%s", table.String())
	}
	r, err := PlanRenewal(dir, []string{RenewAll}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(); err != nil {
		t.Fatal(err)
	}
	rep, _ = CheckExpiration(dir)
	for _, e := range rep.Certificates {
		if !e.Missing && FormatResidual(e.Residual(time.Now())) != "364d" {
			t.Errorf("%s after renewing: %s left", e.Name, FormatResidual(e.Residual(time.Now())))
		}
	}
}

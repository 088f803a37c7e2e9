package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// stoppedControlPlane writes what init writes before it starts anything (cluster.yaml,
// the PKI, the four kubeconfigs), without the binaries: a stopped control plane.
func stoppedControlPlane(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cluster")
	cfg := clusterconfig.Default()
	set, err := clusterpki.Ensure(filepath.Join(dir, "pki"), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, kc := range []struct{ file, user string }{
		{clusterpki.AdminKubeconfig, clusterpki.AdminUser}, {clusterpki.ControllerManagerKubeconfig, clusterpki.ControllerManagerUser},
		{clusterpki.SchedulerKubeconfig, clusterpki.SchedulerUser}, {clusterpki.KubeStateMetricsKubeconfig, clusterpki.KubeStateMetricsUser},
		{clusterpki.KueueKubeconfig, clusterpki.KueueUser},
	} {
		if err := set.EnsureKubeconfig(filepath.Join(dir, kc.file), cfg.ClusterName, cfg.APIServerURL(), kc.user); err != nil {
			t.Fatal(err)
		}
	}
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func residuals(t *testing.T, dir string) map[string]string {
	t.Helper()
	out, err := cli(t, "", "certs", "check-expiration", "--dir", dir)
	if err != nil {
		t.Fatalf("check-expiration: %v", err)
	}
	rows := map[string]string{}
	row := regexp.MustCompile(`(?m)^(\S+)\s+\w{3} \d\d, \d{4} \d\d:\d\d UTC\s+(\S+)\s`)
	for _, m := range row.FindAllStringSubmatch(out, -1) {
		rows[m[1]] = m[2]
	}
	return rows
}

func TestCLICertsOnStoppedControlPlane(t *testing.T) {
	dir := stoppedControlPlane(t)
	rows := residuals(t, dir)
	for _, name := range []string{"admin.conf", "apiserver", "etcd-peer", "front-proxy-client", "scheduler.conf"} {
		if rows[name] != "364d" {
			t.Errorf("%s: residual %q, want 364d", name, rows[name])
		}
	}
	for _, ca := range []string{"ca", "etcd-ca", "front-proxy-ca"} {
		if rows[ca] != "9y" {
			t.Errorf("CA %s: residual %q, want 9y", ca, rows[ca])
		}
	}

	textfile := filepath.Join(t.TempDir(), "certs.prom")
	out, err := cli(t, "", "certs", "check-expiration", "--dir", dir, "--json", "--textfile", textfile,
		"--kubeconfig", filepath.Join(dir, clusterpki.AdminKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Certificates []struct {
			Name         string `json:"name"`
			ResidualTime int64  `json:"residualTime"`
			CAName       string `json:"caName"`
			Missing      bool   `json:"missing"`
		} `json:"certificates"`
		Authorities []struct{ Name string } `json:"certificateAuthorities"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("--json: %v", err)
	}
	if len(report.Certificates) != len(clusterpki.Certificates)+1 || len(report.Authorities) != 3 {
		t.Fatalf("--json lists %d certificates and %d CAs", len(report.Certificates), len(report.Authorities))
	}
	for _, c := range report.Certificates {
		if !c.Missing && (c.ResidualTime < 364*86400 || c.ResidualTime > 365*86400 || c.CAName == "") {
			t.Errorf("--json: %+v", c)
		}
	}
	f, err := os.Open(textfile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(f)
	if err != nil {
		t.Fatalf("--textfile: %v", err)
	}
	got := map[string]float64{}
	for _, m := range families["gpurack_certificate_expiry_timestamp_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["component"] != "controlplane" {
			t.Errorf("sample with labels %v", labels)
		}
		got[labels["name"]] = m.GetGauge().GetValue()
	}
	if left := time.Until(time.Unix(int64(got["apiserver"]), 0)); left < 364*24*time.Hour || got["ca"] == 0 || got["etcd-server"] == 0 {
		t.Errorf("--textfile samples: %v", got)
	}

	out, err = cli(t, "", "certs", "renew", "apiserver", "etcd-peer", "admin.conf", "--dir", dir, "--validity", "2h")
	if err != nil {
		t.Fatalf("renew on a stopped control plane: %v", err)
	}
	for _, want := range []string{"renewed apiserver: ", "renewed etcd-peer: ", "renewed admin.conf: ", "is stopped", "etcd, kube-apiserver read the new certificates when `controlplane-bootstrap init --dir "} {
		if !strings.Contains(out, want) {
			t.Errorf("renew output lacks %q", want)
		}
	}
	rows = residuals(t, dir)
	for name, want := range map[string]string{"apiserver": "1h", "etcd-peer": "1h", "admin.conf": "1h", "etcd-server": "364d", "scheduler.conf": "364d"} {
		if rows[name] != want {
			t.Errorf("after renewing for 2h: %s has %q left, want %s", name, rows[name], want)
		}
	}
}

func TestCLICertsBadInput(t *testing.T) {
	dir := stoppedControlPlane(t)
	os.Rename(filepath.Join(dir, "pki", clusterpki.EtcdCAKey), filepath.Join(t.TempDir(), "etcd-ca.key"))
	before := tree(t, dir)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"renew", "all", "--dir", dir}, []string{"cannot renew apiserver-etcd-client", "its key " + filepath.Join(dir, "pki", clusterpki.EtcdCAKey) + " is missing", "nothing was written"}},
		{[]string{"renew", "apiserver", "apiserver-certificate", "--dir", dir}, []string{`unknown certificate "apiserver-certificate"`, "valid names: all (alone), admin.conf, apiserver, "}},
		{[]string{"renew", "--dir", dir}, []string{"name the certificates to renew: all, or one or more of admin.conf, "}},
		{[]string{"renew", "apiserver", "--dir", dir, "--validity", "0s"}, []string{"--validity 0s: give a positive duration"}},
		{[]string{"renew", "all", "--dir", filepath.Dir(dir)}, []string{"is not a control-plane directory (no pki/ca.crt"}},
		{[]string{"check-expiration", "--dir", filepath.Dir(dir)}, []string{"is not a control-plane directory (no pki/ca.crt"}},
	} {
		out, err := cli(t, "", append([]string{"certs"}, tc.args...)...)
		if err == nil {
			t.Errorf("certs %v succeeded", tc.args)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("certs %v: output lacks %q", tc.args, w)
			}
		}
	}
	after := tree(t, dir)
	for p, data := range before {
		if after[p] != data {
			t.Errorf("%s changed although every renewal was refused", p)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d files before, %d after", len(before), len(after))
	}
	// check-expiration still reads, and calls the etcd CA's certificates externally managed.
	out, err := cli(t, "", "certs", "check-expiration", "--dir", dir)
	if err != nil || !regexp.MustCompile(`(?m)^etcd-server .* etcd-ca\s+yes\s`).MatchString(out) {
		t.Errorf("check-expiration without etcd/ca.key: %v", err)
	}
}

// The operator's path: `certs renew` in its own process asks the supervisor of `init
// --foreground` to restart kube-apiserver, which then serves the renewed certificate.
func TestCLICertsRenewUnderForegroundSupervisor(t *testing.T) {
	testcluster.Require(t)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := cfg.Marshal()
	work := t.TempDir()
	os.WriteFile(filepath.Join(work, "cluster.yaml"), data, 0o644)
	dir := filepath.Join(work, "c")
	startForeground(t, "--config", filepath.Join(work, "cluster.yaml"), "--dir", dir)
	out, err := cli(t, "", "certs", "renew", "apiserver", "--dir", dir, "--validity", "3h")
	if err != nil {
		t.Fatalf("certs renew apiserver: %v", err)
	}
	for _, want := range []string{"asking the supervisor (pid ", "kube-apiserver restarted (pid ", "kube-apiserver at 127.0.0.1:", "serves the renewed certificate"} {
		if !strings.Contains(out, want) {
			t.Errorf("renew output lacks %q", want)
		}
	}
	if rows := residuals(t, dir); rows["apiserver"] != "2h" || rows["apiserver-kubelet-client"] != "364d" {
		t.Errorf("after renewing apiserver for 3h: %v", rows)
	}
	// A component that was still starting when kube-apiserver went away may have
	// exited; the supervisor starts it again (its restart delay is seconds).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, err := cli(t, "", "status", "--dir", dir)
		if err == nil && strings.Count(out, " ok ") == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("status a minute after the renewal: %v\n%s", err, out)
			break
		}
	}
	if _, err := cli(t, "", "stop", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "supervisor.sock")); err == nil {
		t.Error("the supervisor's socket is left after stop")
	}
}

func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			data, _ := os.ReadFile(p)
			files[p] = string(data)
		}
		return err
	})
	return files
}

// kubeadm's own check-expiration, pointed at the PKI directory, reads the same expiry,
// CA and externally-managed flag for every certificate there (it looks for kubeconfigs
// in /etc/kubernetes only, so those are compared by the other tests).
func TestCheckExpirationAgreesWithKubeadm(t *testing.T) {
	testcluster.Require(t, "kubeadm")
	kubeadm, err := components.FindBinary(components.BinDir(""), "kubeadm")
	if err != nil {
		t.Fatal(err)
	}
	dir := stoppedControlPlane(t)
	os.Remove(filepath.Join(dir, "pki", clusterpki.FrontProxyCAKey)) // one CA managed elsewhere
	out, err := exec.Command(kubeadm, "certs", "check-expiration", "--cert-dir", filepath.Join(dir, "pki"), "-o", "json").Output()
	if err != nil {
		t.Fatalf("kubeadm certs check-expiration: %v", err)
	}
	type entry struct {
		Name              string     `json:"name"`
		ExpirationDate    *time.Time `json:"expirationDate"`
		ExternallyManaged bool       `json:"externallyManaged"`
		CAName            string     `json:"caName"`
		Missing           bool       `json:"missing"`
	}
	var theirs, ours struct {
		Certificates []entry `json:"certificates"`
		Authorities  []entry `json:"certificateAuthorities"`
	}
	if err := json.Unmarshal(out, &theirs); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mine, err := cli(t, "", "certs", "check-expiration", "--dir", dir, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(mine), &ours); err != nil {
		t.Fatal(err)
	}
	byName := map[string]entry{}
	for _, e := range append(ours.Certificates, ours.Authorities...) {
		byName[e.Name] = e
	}
	compared := 0
	for _, k := range append(theirs.Certificates, theirs.Authorities...) {
		if k.Missing {
			continue // kubeconfigs in /etc/kubernetes
		}
		o, ok := byName[k.Name]
		if !ok {
			t.Errorf("kubeadm lists %s, check-expiration does not", k.Name)
			continue
		}
		if o.ExpirationDate == nil || !o.ExpirationDate.Equal(*k.ExpirationDate) || o.CAName != k.CAName || o.ExternallyManaged != k.ExternallyManaged {
			t.Errorf("%s: kubeadm %+v, check-expiration %+v", k.Name, k, o)
		}
		compared++
	}
	if compared != 10 {
		t.Errorf("compared %d entries with kubeadm, want 7 certificates and 3 CAs", compared)
	}
}

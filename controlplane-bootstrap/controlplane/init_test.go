package controlplane_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

func TestInitReadyzAndComponentHealth(t *testing.T) {
	c := testcluster.Shared(t)
	for _, h := range c.ControlPlane().Health {
		if !h.OK {
			t.Errorf("after init: %s", h)
		}
		t.Logf("%s", h)
	}
	if len(c.ControlPlane().Health) != 4 {
		t.Fatalf("health of %d components, want 4", len(c.ControlPlane().Health))
	}
	cs := c.Clientset(t)
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "1").DoRaw(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	if !strings.Contains(string(body), "readyz check passed") {
		t.Errorf("/readyz?verbose:\n%s", body)
	}
	st, err := controlplane.GetStatus(ctxFor(t, 30*time.Second), c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range st.Components {
		if !cs.Health.OK || cs.PID == 0 {
			t.Errorf("status: %s pid %d: %s", cs.Name, cs.PID, cs.Health)
		}
	}
	// etcd's membership (issue 31): one member, healthy, the leader, with a database.
	if e := st.Etcd; e == nil || e.Err != "" || len(e.Members) != 1 || !e.Members[0].Healthy || !e.Members[0].Leader ||
		e.Leader != e.Members[0].Name || e.Members[0].DBSize == 0 || e.Members[0].RaftIndex == 0 {
		t.Errorf("status' etcd: %+v; want one healthy member, the leader, with a database", e)
	} else {
		t.Logf("etcd: leader %s, member %+v", e.Leader, e.Members[0])
	}
}

func TestInitAgainOnRunningDirIsSafe(t *testing.T) {
	c := testcluster.Shared(t)
	caBefore, err := os.ReadFile(filepath.Join(c.Dir, "pki", clusterpki.CACert))
	if err != nil {
		t.Fatal(err)
	}
	pid := c.ControlPlane().Supervisor.PID(components.APIServer)
	var out bytes.Buffer
	cp, err := controlplane.Init(ctxFor(t, 2*time.Minute), controlplane.Options{Dir: c.Dir, Out: &out})
	if err != nil {
		t.Fatalf("init again: %v\n%s", err, out.String())
	}
	if !cp.AlreadyRunning || !strings.Contains(out.String(), "already running") {
		t.Errorf("init again did not notice the running control plane:\n%s", out.String())
	}
	caAfter, _ := os.ReadFile(filepath.Join(c.Dir, "pki", clusterpki.CACert))
	if !bytes.Equal(caBefore, caAfter) {
		t.Error("init again replaced the cluster CA")
	}
	if got := c.ControlPlane().Supervisor.PID(components.APIServer); got != pid {
		t.Errorf("kube-apiserver pid changed from %d to %d", pid, got)
	}
}

func TestSecretsEncryptedAtRestAndAudited(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	id, _, _ := strings.Cut(token, ".")
	etcdctl, err := components.FindBinary(components.BinDir(""), "etcdctl")
	if err != nil {
		testreq.Missing(t, "etcdctl is missing", err.Error())
	}
	pkiDir := filepath.Join(c.Dir, "pki")
	out, err := exec.Command(etcdctl,
		"--endpoints=https://127.0.0.1:"+strconv.Itoa(c.Config.Etcd.ClientPort),
		"--cacert="+filepath.Join(pkiDir, clusterpki.EtcdCACert),
		"--cert="+filepath.Join(pkiDir, clusterpki.APIServerEtcdCert),
		"--key="+filepath.Join(pkiDir, clusterpki.APIServerEtcdKey),
		"get", "/registry/secrets/kube-system/bootstrap-token-"+id, "--print-value-only").CombinedOutput()
	if err != nil {
		t.Fatalf("etcdctl get: %v\n%s", err, out)
	}
	if !bytes.HasPrefix(out, []byte("k8s:enc:secretbox:v1:key1:")) {
		t.Errorf("Secret in etcd is not secretbox-encrypted; starts %q", out[:min(40, len(out))])
	}
	if bytes.Contains(out, []byte(strings.SplitN(token, ".", 2)[1])) {
		t.Error("the token secret is readable in etcd")
	}
	audit, err := os.ReadFile(filepath.Join(c.Dir, "logs", "audit.log"))
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	if !bytes.Contains(audit, []byte("bootstrap-token-"+id)) {
		t.Error("the audit log does not record the token's creation")
	}
	if bytes.Contains(audit, []byte(strings.SplitN(token, ".", 2)[1])) {
		t.Error("the audit log contains the token secret")
	}
}

func TestInitNamesPortInUseWithComponent(t *testing.T) {
	testcluster.Require(t)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg.Scheduler.Port = l.Addr().(*net.TCPAddr).Port
	dir := filepath.Join(t.TempDir(), "cluster")
	_, err = controlplane.Init(ctxFor(t, time.Minute), controlplane.Options{Dir: dir, Config: cfg})
	var pe *components.PortInUseError
	if !errors.As(err, &pe) || pe.Component != components.Scheduler {
		t.Fatalf("init with the scheduler's port taken: %v, want a PortInUseError for kube-scheduler", err)
	}
	for _, want := range []string{"kube-scheduler", strconv.Itoa(cfg.Scheduler.Port), "scheduler.port"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("init created the cluster directory although it refused to start")
	}
}

func TestInitSaysToRunMakeK8sBinsForMissingBinary(t *testing.T) {
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.BinDir = t.TempDir()
	dir := filepath.Join(t.TempDir(), "cluster")
	_, err = controlplane.Init(ctxFor(t, time.Minute), controlplane.Options{Dir: dir, Config: cfg})
	var me *components.MissingBinaryError
	if !errors.As(err, &me) {
		t.Fatalf("init without binaries: %v, want a MissingBinaryError", err)
	}
	if !strings.Contains(err.Error(), "make k8s-bins") || !strings.Contains(err.Error(), "etcd") {
		t.Errorf("error %q does not name etcd and `make k8s-bins`", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("init created the cluster directory although binaries are missing")
	}
}

// A component that fails during init stops everything init started, names
// the component with the end of its log, and leaves nothing that trips the
// next init; neither does a PKI directory an interrupted run left half made.
func TestPartialFailureLeavesNothingHalfWritten(t *testing.T) {
	testcluster.Require(t)
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	// An interrupted PKI creation leaves a temporary directory beside pki/.
	if err := os.MkdirAll(filepath.Join(dir, ".pki.tmp-123", "etcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	bad := *cfg
	bad.APIServer.ExtraArgs = map[string]string{"no-such-flag": "1"}
	_, err = controlplane.Init(ctxFor(t, 3*time.Minute), controlplane.Options{Dir: dir, Config: &bad})
	var ce *controlplane.ComponentError
	if !errors.As(err, &ce) || ce.Component != components.APIServer {
		t.Fatalf("init with a bad apiserver flag: %v, want a ComponentError for kube-apiserver", err)
	}
	if !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("error does not show the log line naming the bad flag:\n%v", err)
	}
	t.Logf("init failed as expected:\n%v", err)
	if err := components.CheckPorts(components.Specs(cfg, components.Layout{Dir: dir})); err != nil {
		t.Fatalf("after the failed init a port is still taken (a component was left running): %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".pki.tmp-123")); err == nil {
		t.Error("the stale temporary PKI directory is still there")
	}
	cp, err := controlplane.Init(ctxFor(t, 3*time.Minute), controlplane.Options{Dir: dir, Config: cfg})
	if err != nil {
		t.Fatalf("init after the failed one: %v", err)
	}
	defer cp.Stop()
	cs, err := cp.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("kube-public").Get(ctxFor(t, 30*time.Second), "cluster-info", metav1.GetOptions{}); err != nil {
		t.Errorf("cluster-info after the second init: %v", err)
	}
}

// A site rule file (monitoring.prometheus.ruleFiles) that promtool refuses stops init
// before anything is written, with the file and the line of the mistake; so does a
// missing one.
func TestInitRefusesABadSiteRuleFile(t *testing.T) {
	testcluster.Require(t, "prometheus", "alertmanager", "kube-state-metrics", "victoria-logs", "promtool")
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "site-gpus.yaml")
	// Line 5: a PromQL expression that does not parse.
	rule := "groups:\n  - name: site\n    rules:\n      - alert: SiteGPUsLow\n        expr: sum(gpurack_gpu_count > \n"
	if err := os.WriteFile(bad, []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Monitoring.Enabled = true
	for _, tc := range []struct {
		file string
		want []string
	}{
		{bad, []string{"monitoring.prometheus.ruleFiles", "promtool check rules", bad, "5:"}},
		{filepath.Join(t.TempDir(), "absent.yaml"), []string{"monitoring.prometheus.ruleFiles[0]", "no such file"}},
	} {
		cfg.Monitoring.Prometheus.RuleFiles = []string{tc.file}
		dir := filepath.Join(t.TempDir(), "cluster")
		_, err = controlplane.Init(ctxFor(t, time.Minute), controlplane.Options{Dir: dir, Config: cfg})
		t.Logf("init with rule file %s: %v", filepath.Base(tc.file), err)
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("init with rule file %s: %v; want an error naming %q", tc.file, err, want)
			}
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("init created the cluster directory although rule file %s is refused", tc.file)
		}
	}
}

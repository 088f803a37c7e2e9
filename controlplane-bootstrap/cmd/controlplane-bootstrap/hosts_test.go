package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// hostConfig writes host i's cluster.yaml (nodeName cp-i on 127.0.0.i, free ports,
// controlPlane.hosts hosts) into work and returns its path.
func hostConfig(t *testing.T, work string, i, hosts int) string {
	t.Helper()
	cfg, err := testcluster.Config()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.%d", i)
	cfg.NodeName, cfg.ControlPlane.Hosts = fmt.Sprintf("cp-%d", i), hosts
	cfg.APIServer.AdvertiseAddress, cfg.APIServer.BindAddress = addr, addr
	cfg.APIServer.Endpoint = fmt.Sprintf("%s:%d", addr, cfg.APIServer.Port)
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(work, fmt.Sprintf("cp-%d-of-%d.yaml", i, hosts))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCLIThreeControlPlaneHosts: the first host is init'd with controlPlane.hosts 3;
// upload-certs prints a join command; a join with a wrong certificate key is refused
// and writes nothing; two hosts join (learners, promoted); status shows 3 healthy
// members and a leader; an object written through the third host's API server is read
// through the second's; a fourth host is refused (3 members, hosts 3) and writes
// nothing; with the second host stopped, a host of a 5-host configuration is refused,
// naming the member that does not answer; the second starts again on its data; reset
// of the third removes its member, and status then warns of 2.
func TestCLIThreeControlPlaneHosts(t *testing.T) {
	testcluster.Require(t)
	work := t.TempDir()
	dirs := map[int]string{}
	for i := 1; i <= 4; i++ {
		dirs[i] = filepath.Join(work, fmt.Sprintf("host-%d", i))
	}
	startForeground(t, "--config", hostConfig(t, work, 1, 3), "--dir", dirs[1])
	out, err := cli(t, "", "upload-certs", "--dir", dirs[1])
	if err != nil {
		t.Fatalf("upload-certs: %v", err)
	}
	m := regexp.MustCompile(`controlplane-bootstrap (join --control-plane --server \S+ --token \S+ --ca-cert-hash \S+ --certificate-key (\S+))`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("upload-certs printed no join command")
	}
	joinOf := func(i, hosts int) []string {
		return append(strings.Fields(m[1]), "--config", hostConfig(t, work, i, hosts), "--dir", dirs[i], "--foreground")
	}
	join := func(i int) []string { return joinOf(i, 3) }

	bad := strings.Replace(strings.Join(join(2), " "), m[2], strings.Repeat("0", 64), 1)
	if out, err := cli(t, "", strings.Fields(bad)...); err == nil || !strings.Contains(out, "the certificate key does not open the shared certificates") {
		t.Errorf("join with a wrong certificate key: %v; want refused, naming the key", err)
	}
	if _, err := os.Stat(dirs[2]); !os.IsNotExist(err) {
		t.Errorf("join with a wrong certificate key left %s (%v)", dirs[2], err)
	}

	startForegroundCmd(t, join(2)...)
	startForegroundCmd(t, join(3)...)
	out, err = cli(t, "", "status", "--dir", dirs[1])
	if err != nil || !strings.Contains(out, "etcd: 3 member(s), leader cp-") || strings.Count(out, " healthy ") != 3 || strings.Contains(out, "learner") || strings.Contains(out, "WARNING") {
		t.Errorf("status with three hosts (%v): want 3 healthy voting members, a leader, no warning", err)
	}
	if out, err := cli(t, "", "status", "--dir", dirs[3]); err != nil || !strings.Contains(out, "etcd: 3 member(s)") {
		t.Errorf("status on the third host: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "written-on-3"}, Data: map[string]string{"k": "v"}}
	if _, err := adminOf(t, dirs[3]).CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create through the third host's API server: %v", err)
	}
	if got, err := adminOf(t, dirs[2]).CoreV1().ConfigMaps("default").Get(t.Context(), cm.Name, metav1.GetOptions{}); err != nil || got.Data["k"] != "v" {
		t.Errorf("read through the second host's API server: %v, %v", got, err)
	}

	if out, err := cli(t, "", join(4)...); err == nil || !strings.Contains(out, "etcd has 3 members and controlPlane.hosts is 3") {
		t.Errorf("a fourth host: %v; want refused, naming the 3 members", err)
	}
	if _, err := os.Stat(dirs[4]); !os.IsNotExist(err) {
		t.Errorf("the refused fourth host left %s (%v)", dirs[4], err)
	}

	// A member down: a host that would make a fifth of five (its cluster.yaml says 5)
	// is refused, naming the member; the stopped host then starts again on its data.
	if _, err := cli(t, "", "stop", "--dir", dirs[2]); err != nil {
		t.Fatal(err)
	}
	if out, err := cli(t, "", joinOf(4, 5)...); err == nil || !strings.Contains(out, "etcd member cp-2") || !strings.Contains(out, "does not answer") {
		t.Errorf("a host joining while cp-2 is down: %v; want refused, naming cp-2", err)
	}
	if _, err := os.Stat(dirs[4]); !os.IsNotExist(err) {
		t.Errorf("the host refused while a member is down left %s (%v)", dirs[4], err)
	}
	startForeground(t, "--dir", dirs[2])

	if _, err := cli(t, "", "reset", "--dir", dirs[3], "--yes"); err != nil {
		t.Fatalf("reset of the third host: %v", err)
	}
	out, err = cli(t, "", "status", "--dir", dirs[1])
	if err != nil || !strings.Contains(out, "etcd: 2 member(s)") || strings.Contains(out, "cp-3") ||
		!strings.Contains(out, "WARNING: 2 etcd members: losing either host stops the cluster") {
		t.Errorf("status after the third host's reset (%v): want 2 members, cp-3 gone, the warning", err)
	}
}

// adminOf is an admin clientset through the API server of the host in dir.
func adminOf(t *testing.T, dir string) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestConfigRefusesTwoHosts: controlPlane.hosts 2 and 4 are refused with the reason; 3 is taken.
func TestConfigRefusesTwoHosts(t *testing.T) {
	for hosts, want := range map[int]string{2: "losing either host stops the cluster", 4: "survive the loss of only 1"} {
		y := fmt.Sprintf("apiVersion: gpurack.io/v1alpha1\nkind: ClusterConfig\ncontrolPlane: {hosts: %d}\n", hosts)
		_, err := clusterconfig.Parse("cluster.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), "controlPlane.hosts") || !strings.Contains(err.Error(), want) {
			t.Errorf("hosts %d: %v; want refused on controlPlane.hosts, saying %q", hosts, err, want)
		}
	}
	if _, err := clusterconfig.Parse("cluster.yaml", []byte("apiVersion: gpurack.io/v1alpha1\nkind: ClusterConfig\ncontrolPlane: {hosts: 3}\n")); err != nil {
		t.Errorf("hosts 3: %v", err)
	}
}

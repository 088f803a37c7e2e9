package kubejoin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestDetectCgroupDriver compares with what the kernel says: a cgroup v2 unified
// hierarchy has cgroup.controllers at its root, v1 does not.
func TestDetectCgroupDriver(t *testing.T) {
	got, err := DetectCgroupDriver("/sys/fs/cgroup")
	if err != nil {
		testreq.Missing(t, fmt.Sprintf("no cgroup mount at /sys/fs/cgroup on this host (%v)", err), "run the tests where /sys/fs/cgroup is mounted (a privileged container, or the host)")
	}
	want := "cgroupfs"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		want = "systemd"
	}
	if got != want {
		t.Errorf("DetectCgroupDriver = %s, want %s", got, want)
	}
	t.Logf("this host: %s", got)
	if got, err := DetectCgroupDriver(t.TempDir()); err != nil || got != "cgroupfs" {
		t.Errorf("a plain directory: %s %v, want cgroupfs", got, err)
	}
	if _, err := DetectCgroupDriver(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing mount gave no error")
	}
}

// fakeHost records the D-Bus calls the real node would make (this host's PID 1 is not
// systemd, so SystemdHost is exercised in the QEMU guest, not here).
type fakeHost struct {
	calls []string
	fail  error
}

func (h *fakeHost) SetTransientHostname(_ context.Context, name string) error {
	h.calls = append(h.calls, "hostname "+name)
	return nil
}

func (h *fakeHost) StartUnit(_ context.Context, unit string) error {
	h.calls = append(h.calls, "start "+unit)
	return h.fail
}

// TestStartKubelet writes the kubelet files for real and checks them: config.yaml
// parses as a KubeletConfiguration with the taints, cgroup driver and containerd
// endpoint; the bootstrap kubeconfig authenticates with the bootstrap token against a
// real kube-apiserver as a bootstrapper.
func TestStartKubelet(t *testing.T) {
	c := testcluster.Shared(t)
	token := c.JoinToken(t)
	dir := t.TempDir()
	p := KubeletPaths{BootstrapKubeconfig: filepath.Join(dir, "bootstrap-kubeconfig"), Config: filepath.Join(dir, "config.yaml"), Kubeconfig: filepath.Join(dir, "kubeconfig")}
	j := KubeletJoin{Server: c.Server, ClusterCAPEM: c.CAPEM, Token: token, CgroupDriver: "systemd",
		Taints:     []TaintSpec{{Key: "gpurack.example/dedicated", Value: "ml", Effect: "NoSchedule"}, {Key: "gpurack.io/unvalidated", Effect: "NoSchedule"}},
		ClusterDNS: []string{"10.96.0.10"}, ClusterDomain: "cluster.local"}
	h := &fakeHost{}
	if err := StartKubelet(context.Background(), h, p, "gpu-r1-u07", j); err != nil {
		t.Fatal(err)
	}
	if want := []string{"hostname gpu-r1-u07", "start kubelet.service"}; !reflect.DeepEqual(h.calls, want) {
		t.Errorf("D-Bus calls %v, want %v (hostname before kubelet registers the Node)", h.calls, want)
	}
	data, err := os.ReadFile(p.Config)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		APIVersion, Kind, CgroupDriver, ContainerRuntimeEndpoint, ClusterDomain string
		NodeStatusUpdateFrequency                                               string
		RegisterWithTaints                                                      []TaintSpec
		ClusterDNS                                                              []string
		RotateCertificates                                                      bool
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("config.yaml: %v\n%s", err, data)
	}
	wantTaints := []TaintSpec{{Key: "gpurack.io/unvalidated", Effect: "NoSchedule"}, {Key: "gpurack.example/dedicated", Value: "ml", Effect: "NoSchedule"}}
	if cfg.Kind != "KubeletConfiguration" || cfg.APIVersion != "kubelet.config.k8s.io/v1beta1" || cfg.CgroupDriver != "systemd" ||
		cfg.ContainerRuntimeEndpoint != ContainerdEndpoint || !reflect.DeepEqual(cfg.RegisterWithTaints, wantTaints) ||
		!reflect.DeepEqual(cfg.ClusterDNS, []string{"10.96.0.10"}) || cfg.ClusterDomain != "cluster.local" || !cfg.RotateCertificates ||
		cfg.NodeStatusUpdateFrequency != NodeStatusUpdateFrequency {
		t.Errorf("config.yaml:\n%s", data)
	}
	if fi, err := os.Stat(p.BootstrapKubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("bootstrap kubeconfig mode: %v %v", fi.Mode(), err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", p.BootstrapKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the bootstrap kubeconfig does not authenticate: %v", err)
	}
	groups := map[string]bool{}
	for _, g := range rev.Status.UserInfo.Groups {
		groups[g] = true
	}
	if !groups["system:bootstrappers"] {
		t.Errorf("bootstrap kubeconfig authenticates as %v, want a bootstrapper", rev.Status.UserInfo)
	}

	// A unit that fails to start is reported.
	h = &fakeHost{fail: errors.New("job failed")}
	if err := StartKubelet(context.Background(), h, p, "gpu-r1-u07", j); err == nil {
		t.Error("StartKubelet ignored a failed start")
	}
	j.CgroupDriver = "cgroupfs"
	if data, err := KubeletConfig(j); err != nil || !strings.Contains(string(data), "cgroupDriver: cgroupfs") {
		t.Errorf("cgroupfs config: %v\n%s", err, data)
	}
	j.CgroupDriver = ""
	if _, err := KubeletConfig(j); err == nil {
		t.Error("no cgroup driver accepted")
	}
}

// TestDetectResolvConf: only a resolv.conf naming nothing but systemd-resolved's stub
// sends kubelet to resolved's upstream list, and only where that list exists.
func TestDetectResolvConf(t *testing.T) {
	for _, c := range []struct {
		name, resolv string
		upstream     bool
		want         string
	}{
		{"stub with resolved's upstream list", "# stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n", true, ResolvedUpstream},
		{"stub without the upstream list", "nameserver 127.0.0.53\n", false, ""},
		{"real resolvers", "nameserver 10.0.2.3\n", true, ""},
		{"stub and a real resolver", "nameserver 127.0.0.53\nnameserver 192.0.2.1\n", true, ""},
		{"no nameserver", "search example.org\n", true, ""},
		{"no resolv.conf", "", true, ""},
	} {
		root := t.TempDir()
		if c.resolv != "" {
			if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc/resolv.conf"), []byte(c.resolv), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if c.upstream {
			p := filepath.Join(root, ResolvedUpstream)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("nameserver 10.0.2.3\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := DetectResolvConf(root); got != c.want {
			t.Errorf("%s: DetectResolvConf = %q, want %q", c.name, got, c.want)
		}
	}
	cfg, err := KubeletConfig(KubeletJoin{CgroupDriver: "systemd", ResolvConf: ResolvedUpstream})
	if err != nil || !strings.Contains(string(cfg), "resolvConf: "+ResolvedUpstream) {
		t.Errorf("KubeletConfig with ResolvConf:\n%s\n%v", cfg, err)
	}
	if cfg, _ := KubeletConfig(KubeletJoin{CgroupDriver: "systemd"}); strings.Contains(string(cfg), "resolvConf") {
		t.Errorf("KubeletConfig without ResolvConf sets one:\n%s", cfg)
	}
}

package components

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/internal/testreq"
)

func defaultConfig(t *testing.T, yaml string) *clusterconfig.Config {
	t.Helper()
	cfg, err := clusterconfig.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestSpecsSecurityFlags(t *testing.T) {
	cfg := defaultConfig(t, "")
	l := Layout{Dir: "/cluster"}
	api, _ := Spec(cfg, l, APIServer)
	for _, want := range []string{
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth=true",
		"--encryption-provider-config=/cluster/config/encryption-config.yaml",
		"--audit-policy-file=/cluster/config/audit-policy.yaml",
		"--audit-log-path=/cluster/logs/audit.log",
		"--endpoint-reconciler-type=none",
		"--etcd-servers=https://127.0.0.1:2379",
		"--client-ca-file=/cluster/pki/ca.crt",
	} {
		if !slices.Contains(api.Args, want) {
			t.Errorf("kube-apiserver lacks %s", want)
		}
	}
	kcm, _ := Spec(cfg, l, ControllerManager)
	for _, want := range []string{"--controllers=*,bootstrapsigner,tokencleaner", "--cluster-signing-cert-file=/cluster/pki/ca.crt", "--cluster-signing-key-file=/cluster/pki/ca.key"} {
		if !slices.Contains(kcm.Args, want) {
			t.Errorf("kube-controller-manager lacks %s", want)
		}
	}
	etcd, _ := Spec(cfg, l, Etcd)
	for _, want := range []string{"--client-cert-auth=true", "--peer-client-cert-auth=true", "--listen-metrics-urls=http://127.0.0.1:2381"} {
		if !slices.Contains(etcd.Args, want) {
			t.Errorf("etcd lacks %s", want)
		}
	}
	if !slices.IsSorted(api.Args) {
		t.Error("flags are not sorted")
	}
}

func TestSpecsRoutableAdvertiseAddress(t *testing.T) {
	cfg := defaultConfig(t, "apiServer:\n  advertiseAddress: 192.0.2.10\n  bindAddress: 0.0.0.0\n")
	api, _ := Spec(cfg, Layout{Dir: "/c"}, APIServer)
	for _, a := range api.Args {
		if strings.HasPrefix(a, "--endpoint-reconciler-type") {
			t.Errorf("routable advertise address still gets %s", a)
		}
	}
	if api.HealthURL != "https://127.0.0.1:6443/readyz" {
		t.Errorf("health URL %s", api.HealthURL)
	}
	etcd, _ := Spec(cfg, Layout{Dir: "/c"}, Etcd)
	if !slices.Contains(etcd.Args, "--listen-client-urls=https://127.0.0.1:2379,https://192.0.2.10:2379") {
		t.Errorf("etcd client URLs: %v", etcd.Args)
	}
}

func TestExtraArgsOverride(t *testing.T) {
	cfg := defaultConfig(t, "scheduler:\n  extraArgs:\n    leader-elect: \"true\"\n    v: \"4\"\n")
	s, _ := Spec(cfg, Layout{Dir: "/c"}, Scheduler)
	if !slices.Contains(s.Args, "--leader-elect=true") || slices.Contains(s.Args, "--leader-elect=false") || !slices.Contains(s.Args, "--v=4") {
		t.Errorf("extraArgs not applied: %v", s.Args)
	}
}

func TestRenderUnit(t *testing.T) {
	cfg := defaultConfig(t, "apiServer:\n  extraArgs:\n    audit-log-format: \"json text\"\n")
	api, _ := Spec(cfg, Layout{Dir: "/var/lib/gpurack/cluster"}, APIServer)
	unit := string(RenderUnit(api, "/opt/k8s/bin/kube-apiserver", Etcd, "/var/lib/gpurack/cluster"))
	for _, want := range []string{
		"[Unit]\nDescription=gpurack control plane: kube-apiserver\n",
		"After=network-online.target gpurack-etcd.service\n",
		"Wants=network-online.target gpurack-etcd.service\n",
		"ExecStart=/opt/k8s/bin/kube-apiserver \\\n\t--advertise-address=127.0.0.1 \\\n",
		"\t\"--audit-log-format=json text\" \\\n",
		"Restart=always\n",
		"CapabilityBoundingSet=\nProtectSystem=strict\n",
		"ReadWritePaths=/var/lib/gpurack/cluster\n",
		"[Install]\nWantedBy=multi-user.target\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	etcd, _ := Spec(cfg, Layout{Dir: "/c"}, Etcd)
	eu := string(RenderUnit(etcd, "/bin/etcd", "", "/c"))
	if !strings.Contains(eu, "Type=notify") || strings.Contains(eu, "gpurack-.service") {
		t.Errorf("etcd unit:\n%s", eu)
	}
	if UnitName(Scheduler) != "gpurack-kube-scheduler.service" {
		t.Error(UnitName(Scheduler))
	}
}

func TestEncryptionConfigAndAuditPolicy(t *testing.T) {
	ec := string(EncryptionConfig("c2VjcmV0"))
	if !strings.Contains(ec, "kind: EncryptionConfiguration") || !strings.Contains(ec, "secret: c2VjcmV0") || !strings.Contains(ec, "- secretbox:") {
		t.Errorf("encryption config:\n%s", ec)
	}
	if !strings.Contains(string(AuditPolicy), "kind: Policy") {
		t.Error("audit policy")
	}
}

func TestFindBinaryMissingSaysMakeK8sBins(t *testing.T) {
	_, err := FindBinary(t.TempDir(), "kube-apiserver")
	var me *MissingBinaryError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "make k8s-bins") {
		t.Fatalf("err %v", err)
	}
	t.Setenv(K8sDirEnv, "/k8s")
	if BinDir("") != "/k8s/bin" || BinDir("/x") != "/x" {
		t.Errorf("BinDir: %s", BinDir(""))
	}
}

func TestCheckPortsNamesComponent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	err = CheckPorts([]Component{{Name: ControllerManager, Ports: []Port{{"127.0.0.1", port, "controllerManager.port"}}}})
	var pe *PortInUseError
	if !errors.As(err, &pe) || pe.Component != ControllerManager || !strings.Contains(err.Error(), "controllerManager.port") {
		t.Fatalf("err %v", err)
	}
}

// The supervisor restarts a process killed with SIGKILL, reports the exit,
// and stops it for good on Stop. It runs a real process (sleep).
func TestSupervisorRestartsAndStops(t *testing.T) {
	sleep := testreq.Tool(t, "sleep", "apt-get install coreutils")
	dir := t.TempDir()
	var mu sync.Mutex
	var events []string
	s := NewSupervisor(func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, f)
	})
	p := Process{Name: "sleeper", Path: sleep, Args: []string{"300"}, LogFile: filepath.Join(dir, "sleeper.log"), PIDFile: filepath.Join(dir, "sleeper.pid")}
	if err := s.Start(p); err != nil {
		t.Fatal(err)
	}
	first := s.PID("sleeper")
	syscall.Kill(first, syscall.SIGKILL)
	select {
	case ev := <-s.Exits():
		if ev.Name != "sleeper" || ev.PID != first || !strings.Contains(ev.Err.Error(), "killed") {
			t.Errorf("exit event %+v", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit event")
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.PID("sleeper") == first || s.Restarts("sleeper") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not restarted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	second := s.PID("sleeper")
	if data, _ := os.ReadFile(p.PIDFile); strings.TrimSpace(string(data)) != itoa(second) {
		t.Errorf("pid file %q, want %d", data, second)
	}
	s.Stop(5 * time.Second)
	if syscall.Kill(second, 0) == nil {
		t.Error("process still alive after Stop")
	}
	if _, err := os.Stat(p.PIDFile); err == nil {
		t.Error("pid file left after Stop")
	}
	if err := s.Start(p); err == nil {
		t.Error("Start after Stop succeeded")
	}
	if err := NewSupervisor(t.Logf).Start(Process{Name: "x", Path: filepath.Join(dir, "missing"), LogFile: filepath.Join(dir, "x.log")}); err == nil {
		t.Error("starting a missing binary succeeded")
	}
}

func TestOIDCFlags(t *testing.T) {
	cfg := defaultConfig(t, "apiServer:\n  oidc:\n    issuerURL: https://idp.example.com/realms/gpu\n    clientID: gpurack\n    groupsClaim: groups\n    groupsPrefix: \"gpurack:tenant:\"\n    requiredClaims: {hd: example.com, aud2: x}\n")
	api, _ := Spec(cfg, Layout{Dir: "/c"}, APIServer)
	for _, want := range []string{
		"--oidc-issuer-url=https://idp.example.com/realms/gpu", "--oidc-client-id=gpurack",
		"--oidc-username-claim=sub", "--oidc-username-prefix=oidc:",
		"--oidc-groups-claim=groups", "--oidc-groups-prefix=gpurack:tenant:",
		"--oidc-required-claim=aud2=x,hd=example.com",
	} {
		if !slices.Contains(api.Args, want) {
			t.Errorf("apiserver args lack %s: %v", want, api.Args)
		}
	}
	plain, _ := Spec(defaultConfig(t, ""), Layout{Dir: "/c"}, APIServer)
	for _, a := range plain.Args {
		if strings.HasPrefix(a, "--oidc-") {
			t.Errorf("OIDC flag without an issuer: %s", a)
		}
	}
}

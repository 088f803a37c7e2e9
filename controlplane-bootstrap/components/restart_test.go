package components

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/internal/testreq"
)

// A requested restart replaces the process at once, is neither an exit event nor a
// counted restart, and kills a process that ignores SIGTERM after the grace period.
func TestSupervisorRestartOnRequest(t *testing.T) {
	sh := testreq.Tool(t, "sh", "apt-get install dash")
	testreq.Tool(t, "sleep", "apt-get install coreutils")
	dir := t.TempDir()
	var mu sync.Mutex
	var log []string
	s := NewSupervisor(func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		log = append(log, f)
	})
	defer s.Stop(5 * time.Second)
	for _, p := range []Process{
		{Name: "polite", Path: sh, Args: []string{"-c", "exec sleep 300"}, LogFile: filepath.Join(dir, "polite.log")},
		// Ignores SIGTERM; a short sleep so that no orphan outlives the test for long.
		{Name: "stubborn", Path: sh, Args: []string{"-c", `trap "" TERM; while :; do sleep 0.1; done`}, LogFile: filepath.Join(dir, "stubborn.log")},
	} {
		if err := s.Start(p); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // let the shell install its trap
	for _, name := range []string{"polite", "stubborn"} {
		old := s.PID(name)
		began := time.Now()
		if err := s.Restart(name, time.Second); err != nil {
			t.Fatalf("restart %s: %v", name, err)
		}
		took := time.Since(began)
		if s.PID(name) == old || s.PID(name) == 0 {
			t.Errorf("%s: pid %d after the restart, was %d", name, s.PID(name), old)
		}
		if syscall.Kill(old, 0) == nil {
			t.Errorf("%s: the old process %d is still alive", name, old)
		}
		if s.Restarts(name) != 0 {
			t.Errorf("%s: a requested restart counted as a crash restart", name)
		}
		if name == "polite" && took > 900*time.Millisecond {
			t.Errorf("polite process took %s to restart: not stopped by SIGTERM?", took)
		}
		if name == "stubborn" && took < time.Second {
			t.Errorf("stubborn process restarted after %s, before the grace period", took)
		}
	}
	select {
	case ev := <-s.Exits():
		t.Errorf("a requested restart was reported as an exit: %+v", ev)
	default:
	}
	mu.Lock()
	if !slices.Contains(log, "%s did not stop within %s; killing it") || !slices.Contains(log, "%s (pid %d) stopped for a requested restart") {
		t.Errorf("supervisor log: %q", log)
	}
	mu.Unlock()
	if err := s.Restart("nobody", time.Second); err == nil || !strings.Contains(err.Error(), "not supervised") {
		t.Errorf("restart of an unknown process: %v", err)
	}
	s.Stop(5 * time.Second)
	if err := s.Restart("polite", time.Second); err == nil {
		t.Error("restart after Stop succeeded")
	}
}

func TestUsingFindsTheComponentsOfRenewedFiles(t *testing.T) {
	cfg := defaultConfig(t, "")
	l := Layout{Dir: "/cluster"}
	specs := Specs(cfg, l)
	for _, tc := range []struct {
		paths []string
		want  []string
	}{
		{[]string{l.PKI(clusterpki.APIServerKey), l.PKI(clusterpki.APIServerCert)}, []string{APIServer}},
		{[]string{l.PKI(clusterpki.EtcdPeerCert)}, []string{Etcd}},
		{[]string{l.PKI(clusterpki.APIServerEtcdCert), l.PKI(clusterpki.EtcdServerCert)}, []string{Etcd, APIServer}},
		{[]string{l.PKI(clusterpki.FrontProxyClientCert)}, []string{APIServer}},
		{[]string{l.Kubeconfig(clusterpki.SchedulerKubeconfig)}, []string{Scheduler}},
		{[]string{l.PKI(clusterpki.ControllerManagerServingDir + "/kube-controller-manager.crt")}, []string{ControllerManager}},
		{[]string{l.Kubeconfig(clusterpki.AdminKubeconfig), l.PKI(clusterpki.EtcdHealthcheckCert)}, nil},
	} {
		if got := Using(specs, tc.paths); !slices.Equal(got, tc.want) {
			t.Errorf("Using(%v) = %v, want %v", tc.paths, got, tc.want)
		}
	}
	// A certificate the operator moved elsewhere with extraArgs is no longer the
	// component's.
	moved := defaultConfig(t, "apiServer:\n  extraArgs: {tls-cert-file: /elsewhere/api.crt, tls-private-key-file: /elsewhere/api.key}\n")
	if got := Using(Specs(moved, l), []string{l.PKI(clusterpki.APIServerCert), l.PKI(clusterpki.APIServerKey)}); got != nil {
		t.Errorf("Using with the serving certificate moved: %v", got)
	}
	every := []string{}
	for _, c := range clusterpki.Certificates {
		every = append(every, filepath.Join(l.Dir, c.Cert))
	}
	if got := Using(specs, every); !slices.Equal(got, Names) {
		t.Errorf("renewing everything restarts %v, want %v", got, Names)
	}
}

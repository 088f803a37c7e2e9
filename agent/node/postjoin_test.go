package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// scriptedService fails its first attempts with errs in turn, then runs until ctx
// ends. waitGate waits for its upAfter gate before it says it is up; it opens its gate
// once up.
type scriptedService struct {
	statusCell
	name     string
	errs     []error
	waitGate bool
	mu       sync.Mutex
	attempts int
	up       chan struct{}
	// order, when set, gets the name once the service is up, before it opens its
	// gate: the order of names is the order the services came up.
	order chan string
}

func (s *scriptedService) Name() string { return s.name }

func (s *scriptedService) attempt(ctx context.Context, g gated) error {
	s.mu.Lock()
	s.attempts++
	n := s.attempts
	s.mu.Unlock()
	if n <= len(s.errs) {
		return s.errs[n-1]
	}
	if s.waitGate {
		if err := g.wait(ctx); err != nil {
			return nil
		}
	}
	s.set(Running, "up")
	if s.order != nil {
		s.order <- s.name
	}
	g.open()
	close(s.up)
	<-ctx.Done()
	return nil
}

func (s *scriptedService) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts
}

var errModule = errors.New("nf_tables still loading")

// The supervisor restarts by the declared policy and says each failure in the status
// and on the console; a permanent error or a service without a policy fails for good.
func TestSupervisorRestarts(t *testing.T) {
	fast := retry.Backoff{First: time.Millisecond, Max: 4 * time.Millisecond}
	for _, tc := range []struct {
		name     string
		errs     []error
		restart  retry.Backoff
		attempts int
		state    ServiceState // once it settled (Running: it came up)
		console  []string
	}{
		{name: "up at once", restart: fast, attempts: 1, state: Running},
		{name: "up on the third attempt", errs: []error{errModule, errModule}, restart: fast, attempts: 3, state: Running,
			console: []string{"gpuagent: thing failed: nf_tables still loading (trying again in 1ms)",
				"gpuagent: thing failed: nf_tables still loading (trying again in 2ms)"}},
		{name: "permanent", errs: []error{errModule, retry.Permanent(errModule)}, restart: fast, attempts: 2, state: Failed,
			console: []string{"gpuagent: thing failed: nf_tables still loading (trying again in 1ms)"}},
		{name: "not restarted", errs: []error{errModule}, attempts: 1, state: Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			console := filepath.Join(t.TempDir(), "console")
			if err := os.WriteFile(console, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := &node{cfg: Config{Console: console}, log: slog.New(slog.DiscardHandler), services: NewServices(ctx, slog.New(slog.DiscardHandler))}
			svc := &scriptedService{name: "thing", errs: tc.errs, up: make(chan struct{})}
			n.supervise([]postJoinService{{svc: svc, what: "thing", startAfter: kubeletJoined, restart: tc.restart}}, kubeletJoined)
			st := waitSettled(t, n.services)
			if st.State != tc.state || svc.count() != tc.attempts {
				t.Errorf("%s after %d attempts, want %s after %d: %v", st.State, svc.count(), tc.state, tc.attempts, st)
			}
			if tc.state == Failed && st.Message != errModule.Error() {
				t.Errorf("failed with %q, want the attempt's error", st.Message)
			}
			data, _ := os.ReadFile(console)
			var lines []string
			for _, l := range strings.Split(string(data), "\n") {
				if l = strings.Trim(l, "\r"); l != "" {
					lines = append(lines, l)
				}
			}
			if !slices.Equal(lines, tc.console) {
				t.Errorf("console:\n%q\nwant\n%q", lines, tc.console)
			}
			cancel()
			n.services.Wait()
		})
	}
}

// waitSettled returns the one service's status once it is running or its Run returned.
func waitSettled(t *testing.T, s *Services) NamedStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Statuses()
		if len(st) == 1 && st[0].State == Running || len(st) == 1 && st[0].State == Failed && !strings.HasPrefix(st[0].Message, "failed: ") {
			return st[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("statuses %v: never settled", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// A service does not start before its start gate opens, and one waiting for another's
// gate comes up only after that one is up.
func TestSupervisorGates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := &node{log: slog.New(slog.DiscardHandler), services: NewServices(ctx, slog.New(slog.DiscardHandler))}
	order := make(chan string, 2)
	first := &scriptedService{name: "first", errs: []error{errModule}, up: make(chan struct{}), order: order}
	second := &scriptedService{name: "second", waitGate: true, up: make(chan struct{}), order: order}
	late := &scriptedService{name: "late", up: make(chan struct{})}
	fast := retry.Backoff{First: 20 * time.Millisecond, Max: 20 * time.Millisecond}
	n.supervise([]postJoinService{
		{svc: second, startAfter: kubeletJoined, upAfter: kubeProxySynced, restart: fast},
		{svc: first, startAfter: kubeletJoined, opens: kubeProxySynced, restart: fast},
		{svc: late, startAfter: gate("never opened")},
	}, kubeletJoined)
	// Both come up, first then second: second waits for the gate first opens once
	// it is up. (Watching the two up channels instead raced: once the gate is open
	// both may be closed by the time a select looks.)
	for _, want := range []string{"first", "second"} {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("%s came up before first opened its gate", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never came up", want)
		}
	}
	cancel()
	n.services.Wait()
	if late.count() != 0 {
		t.Errorf("late ran %d attempts before its start gate opened", late.count())
	}
	for _, st := range n.services.Statuses() {
		if st.State != Stopped {
			t.Errorf("after stop: %v", st)
		}
	}
}

// The declared list: which services, what each waits for and opens, how each restarts.
func TestPostJoinServices(t *testing.T) {
	type row struct {
		name                       string
		startAfter, upAfter, opens gate
		restarted                  bool
	}
	all := []row{
		{"kube-proxy", kubeletJoined, "", kubeProxySynced, true},
		{"pod-network", kubeletJoined, kubeProxySynced, "", true},
		{"network-policy", kubeletJoined, "", "", true},
		{"device-plugin", kubeletJoined, "", "", false},
		{"data-disks", kubeletJoined, "", "", true},
		{"local-volumes", kubeletJoined, "", "", true},
		{"shared-volumes", kubeletJoined, "", "", true},
		{"node-exporter", kubeletJoined, "", "", true},
	}
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	caPEM := string(pki.EncodeCertPEM(ca.Cert))
	noExporter := row{"node-exporter", kubeletJoined, "", "", false}
	reg := row{"registry-hosts", kubeletJoined, "", "", true}
	for _, tc := range []struct {
		name         string
		bundle       *bootv1.JoinBundle
		devicePlugin bool
		exporter     string // --node-exporter-listen
		want         []row
	}{
		{"kubelet node", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM, ClusterCaPem: caPEM}, false, "", append(all[:8:8], reg)},
		{"device plugin since the start", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM, ClusterCaPem: caPEM}, true, "", append(all[:3:3], all[4], all[5], all[6], all[7], reg)},
		{"bad pod subnet: no kube-proxy", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM, ClusterCaPem: caPEM, PodNetwork: &bootv1.PodNetwork{Subnet: "10.244.0.0"}}, false, "",
			[]row{{"pod-network", kubeletJoined, "", "", false}, all[2], all[3], all[4], all[5], all[6], all[7], reg}},
		{"no gpurack CA: data disks fail and say so", &bootv1.JoinBundle{NodeName: "gpu-1", ClusterCaPem: caPEM}, false, "",
			append(all[:4:4], row{"data-disks", kubeletJoined, "", "", false}, all[5], all[6], all[7], reg)},
		{"no cluster CA: node_exporter fails and says so", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM}, false, "",
			append(all[:7:7], noExporter, reg)},
		{"node_exporter off", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM, ClusterCaPem: caPEM}, false, "off", append(all[:7:7], reg)},
		{"logs endpoint: log shipping", &bootv1.JoinBundle{NodeName: "gpu-1", GpurackCaPem: caPEM, ClusterCaPem: caPEM, LogsEndpoint: "10.0.0.2:9428"}, false, "",
			append(all[:8:8], row{"log-shipping", kubeletJoined, "", "", true}, reg)},
	} {
		cfg := simConfig(t)
		cfg.DevicePlugin = tc.devicePlugin
		cfg.NodeExporterListen = tc.exporter
		n := &node{cfg: cfg, log: cfg.Log}
		var got []row
		for _, d := range n.postJoinServices(tc.bundle) {
			got = append(got, row{d.svc.Name(), d.startAfter, d.upAfter, d.opens, d.restart.First > 0})
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: declared\n%v\nwant\n%v", tc.name, got, tc.want)
		}
	}
}

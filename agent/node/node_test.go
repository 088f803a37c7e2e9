package node

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

// fakeService runs until ctx ends, or fails at once with err.
type fakeService struct {
	statusCell
	name string
	err  error
}

func (f *fakeService) Name() string { return f.name }

func (f *fakeService) Run(ctx context.Context) error {
	if f.err != nil {
		return f.err
	}
	f.set(Running, "working")
	<-ctx.Done()
	return nil
}

func TestServicesReport(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := NewServices(ctx, slog.New(slog.DiscardHandler))
	s.Start(&fakeService{name: "ok"})
	s.Start(&fakeService{name: "broken", err: errors.New("port taken")})
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Statuses()
		if len(st) == 2 && st[0].State == Running && st[1].State == Failed {
			if st[1].Message != "port taken" || st[0].Name != "ok" || st[1].Name != "broken" {
				t.Errorf("statuses %v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statuses %v, want ok running and broken failed", st)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	s.Wait()
	if st := s.Statuses(); st[0].State != Stopped || st[1].State != Failed {
		t.Errorf("after stop: %v", st)
	}
}

func simConfig(t *testing.T) Config {
	t.Helper()
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "node-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	dir := t.TempDir()
	return Config{Backend: s, Sim: s, Profile: p, Log: slog.New(slog.DiscardHandler), Socket: filepath.Join(dir, "agent.sock"),
		KeyDir: dir, Interval: time.Second, ClearAfter: time.Second, NodeName: "node-test", FactsRoot: facts.Root(dir)}
}

// TestNodeServices runs a simulated node with only the local socket: the API answers
// there, every service reports, and all of them stop with the context.
func TestNodeServices(t *testing.T) {
	cfg := simConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := newNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range n.services.Statuses() {
		names = append(names, st.Name)
	}
	if !slices.Equal(names, []string{"grpc-unix", "checks", "watchdog"}) {
		t.Errorf("services %v, want grpc-unix, checks, watchdog (no TCP, metrics, gossip or join configured)", names)
	}
	conn, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	st, err := agentv1.NewAgentServiceClient(conn).Status(cctx, &agentv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeName != "node-test" || st.GetEnrollment().GetState() != agentv1.EnrollmentState_ENROLLMENT_STATE_NOT_ENROLLING {
		t.Errorf("Status: node %q enrollment %v", st.NodeName, st.GetEnrollment())
	}
	cancel()
	n.services.Wait()
	for _, s := range n.services.Statuses() {
		if s.State != Stopped {
			t.Errorf("after stop: %v", s)
		}
	}
	if _, err := os.Stat(cfg.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestNodeBadConfigStartsNothing: a listener that cannot be opened is an error, and
// what was opened before it is released.
func TestNodeBadConfigStartsNothing(t *testing.T) {
	cfg := simConfig(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg.MetricsListen = taken.Addr().String()
	if _, err := newNode(context.Background(), cfg); err == nil {
		t.Fatal("metrics address in use: no error")
	}
	if c, err := net.Dial("unix", cfg.Socket); err == nil {
		c.Close()
		t.Error("the local socket still accepts after the failed start")
	}
}

// registrar is kubelet's Registration service: it records what registers.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

// TestDevicePluginFromStart: with DevicePlugin the agent serves the device plugin from
// the start to a kubelet it did not start (here the simulator, as beside a real
// kubelet): the plugin registers nvidia.com/gpu on kubelet.sock, writes the simulated
// CDI spec, and ListAndWatch lists the 8 GPUs healthy.
func TestDevicePluginFromStart(t *testing.T) {
	cfg := simConfig(t)
	dir, err := os.MkdirTemp("", "gpr-node-dp-") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.DevicePlugin, cfg.DevicePluginDir = true, filepath.Join(dir, "device-plugins")
	cfg.CDIDir, cfg.SimDevDir = filepath.Join(dir, "cdi"), filepath.Join(dir, "dev")
	if err := os.MkdirAll(cfg.DevicePluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(cfg.DevicePluginDir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{got: make(chan *pluginapi.RegisterRequest, 4)}
	gs := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(gs, reg)
	go gs.Serve(l)
	defer gs.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := newNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var req *pluginapi.RegisterRequest
	select {
	case req = <-reg.got:
	case <-time.After(30 * time.Second):
		t.Fatalf("the device plugin did not register within 30 s; services %v", n.services.Statuses())
	}
	if req.ResourceName != "nvidia.com/gpu" {
		t.Errorf("registered %q, want nvidia.com/gpu", req.ResourceName)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.DevicePluginDir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	healthy := 0
	for _, d := range resp.Devices {
		if d.Health == pluginapi.Healthy {
			healthy++
		}
	}
	if len(resp.Devices) != 8 || healthy != 8 {
		t.Errorf("ListAndWatch: %d devices, %d healthy; want 8 and 8", len(resp.Devices), healthy)
	}
	if _, err := os.Stat(filepath.Join(cfg.CDIDir, "gpurack-simulated.yaml")); err != nil {
		t.Errorf("the simulated CDI spec: %v", err)
	}
	cancel()
	n.services.Wait()
}

// TestRegisterFactsCarryBootID: the facts sent with Register carry the kernel's boot id,
// which gpuboot compares with the Node's status.nodeInfo.bootID before it deletes a
// rejoining machine's bootstrap token (CONTRACTS §2.7).
func TestRegisterFactsCarryBootID(t *testing.T) {
	cfg := simConfig(t)
	dir := string(cfg.FactsRoot)
	if err := os.MkdirAll(filepath.Join(dir, "proc/sys/kernel/random"), 0o755); err != nil {
		t.Fatal(err)
	}
	const bootID = "5b1c2d3e-0000-4000-8000-000000000001"
	if err := os.WriteFile(filepath.Join(dir, "proc/sys/kernel/random/boot_id"), []byte(bootID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &node{cfg: cfg}
	if got := n.facts(facts.Identity{}, nil).GetBootId(); got != bootID {
		t.Errorf("Register facts boot_id = %q, want %q", got, bootID)
	}
}

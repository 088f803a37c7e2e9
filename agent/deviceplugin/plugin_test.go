package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/internal/profile"
)

// fakeKubelet is kubelet's side of registration: the v1beta1 Registration service on
// kubelet.sock, a real gRPC server on a real unix socket.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
	gs   *grpc.Server
}

// simRig is what the plugin tests start from: a simulated DGX H100 under the agent's
// monitor (checks every 100 ms, the hysteresis clearAfter; 0: the monitor's default),
// a device-plugins directory and a fake kubelet serving Registration in it.
func simRig(tb testing.TB, ctx context.Context, clearAfter time.Duration) (*sim.Sim, *monitor.Monitor, string, *fakeKubelet) {
	tb.Helper()
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version})
	if err != nil {
		tb.Fatal(err)
	}
	mon := monitor.New(monitor.Config{Backend: s, Profile: p, Interval: 100 * time.Millisecond, ClearAfter: clearAfter})
	go mon.Run(ctx)
	dir, err := os.MkdirTemp("", "gpr-dp-") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return s, mon, dir, startKubelet(tb, dir)
}

// dialPlugin is kubelet's client of the plugin's socket, closed when tb ends.
func dialPlugin(tb testing.TB, socket string) pluginapi.DevicePluginClient {
	tb.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// startKubelet serves Registration on dir/kubelet.sock, first removing every socket
// in dir as kubelet's device manager does when it starts.
func startKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{regs: make(chan *pluginapi.RegisterRequest, 4), gs: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.gs, k)
	go k.gs.Serve(l)
	t.Cleanup(k.gs.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) waitRegistration(t testing.TB) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the plugin did not register within 30 s")
		return nil
	}
}

// The plugin against a simulated DGX H100: it registers nvidia.com/gpu on kubelet.sock;
// a ListAndWatch client on its socket sees 8 healthy GPUs, 7 after an injected XID 79
// on gpu3, 8 again once the fault is cleared and the agent's hysteresis has passed, with
// no restart; it registers again when kubelet restarts (kubelet.sock recreated); and
// with NVML lost every GPU goes Unhealthy.
func TestPluginRegistersAndFollowsHealth(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, mon, dir, kubelet := simRig(t, ctx, 2*time.Second)
	cdiGPUs := make(chan []GPU, 1)
	plugin := New(Config{Monitor: mon, Dir: dir, Simulated: true, Poll: 100 * time.Millisecond,
		CDI: func(_ context.Context, gpus []GPU) error { cdiGPUs <- gpus; return nil }})
	done := make(chan error, 1)
	go func() { done <- plugin.Run(ctx) }()

	reg := kubelet.waitRegistration(t)
	if gpus := <-cdiGPUs; len(gpus) != 8 {
		t.Errorf("the CDI spec was written for %v, want 8 GPUs", gpus)
	}
	if reg.Version != pluginapi.Version || reg.ResourceName != nodecontract.ResourceGPU || reg.Endpoint != SocketName || !reg.GetOptions().GetGetPreferredAllocationAvailable() {
		t.Fatalf("registration %+v", reg)
	}

	client := dialPlugin(t, filepath.Join(dir, reg.Endpoint))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	await := func(what string, want func(healthy map[string]bool) bool) map[string]bool {
		t.Helper()
		return awaitList(ctx, t, stream, plugin, what, want)
	}
	h := await("8 healthy GPUs", func(h map[string]bool) bool { return len(h) == 8 && countHealthy(h) == 8 })
	uuid3 := mon.Last().Snapshot.ByIndex(3).UUID
	if _, ok := h[uuid3]; !ok {
		t.Fatalf("device IDs %v lack gpu3's UUID %s", h, uuid3)
	}

	injectXID79(t, s, 3)
	await("gpu3 Unhealthy after XID 79", func(h map[string]bool) bool { return len(h) == 8 && countHealthy(h) == 7 && !h[uuid3] })

	// Allocate on the simulator: the GPU as a CDI device (CRI field and annotation),
	// simulation-labelled.
	ar, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{uuid3}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := ar.ContainerResponses[0]
	_, annotated, err := cdiapi.ParseAnnotations(cr.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != "nvidia.com/gpu="+uuid3 || !slices.Equal(annotated, []string{"nvidia.com/gpu=" + uuid3}) ||
		cr.Annotations["gpurack.io/simulated"] != "true" || cr.Envs["GPURACK_SIMULATED_GPUS"] != "true" || len(cr.Devices) != 0 {
		t.Errorf("simulated Allocate = %+v", cr)
	}

	// The fault cleared (the simulated GPU counts as reset): healthy again after the
	// hysteresis, without a restart of the plugin.
	s.Clear()
	mon.GPUsReset([]int{3})
	await("gpu3 Healthy again", func(h map[string]bool) bool { return len(h) == 8 && countHealthy(h) == 8 })

	// kubelet restarts: its device manager removes the sockets and serves a new
	// kubelet.sock; the plugin registers again on a fresh socket.
	kubelet.gs.Stop()
	kubelet2 := startKubelet(t, dir)
	if reg := kubelet2.waitRegistration(t); reg.ResourceName != nodecontract.ResourceGPU {
		t.Fatalf("re-registration %+v", reg)
	}
	conn2, err := grpc.NewClient("unix://"+filepath.Join(dir, SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	stream, err = pluginapi.NewDevicePluginClient(conn2).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	await("8 healthy GPUs after kubelet restarted", func(h map[string]bool) bool { return len(h) == 8 && countHealthy(h) == 8 })
	// NVML lost mid-run: every GPU Unhealthy, the reason naming NVML.
	if _, err := s.Inject(sim.Fault{Kind: sim.KindDriverUnloaded, GPU: -1}, 0); err != nil {
		t.Fatal(err)
	}
	mon.Kick()
	await("every GPU Unhealthy with NVML lost", func(h map[string]bool) bool { return len(h) == 8 && countHealthy(h) == 0 })
	if d := plugin.Devices()[0]; !strings.Contains(d.Reason, "NVML") {
		t.Errorf("reason %q does not name NVML", d.Reason)
	}
	if ok, msg := plugin.State(); !ok {
		t.Errorf("plugin state %q: not registered", msg)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

// Time-slicing over the same gRPC: with 4 replicas a simulated DGX H100 is 32 devices
// <UUID>::0..3; GetPreferredAllocation for two gives replicas of two GPUs; Allocate of
// two replicas of one GPU gives that GPU once as a CDI device; XID 79 on gpu3 takes
// all four of its replicas out, and only those.
func TestPluginTimeSlicing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, mon, dir, kubelet := simRig(t, ctx, 0)
	plugin := New(Config{Monitor: mon, Dir: dir, Simulated: true, Replicas: 4, Poll: 100 * time.Millisecond})
	go plugin.Run(ctx)
	reg := kubelet.waitRegistration(t)
	if reg.ResourceName != nodecontract.ResourceGPU {
		t.Fatalf("registration %+v", reg)
	}
	client := dialPlugin(t, filepath.Join(dir, reg.Endpoint))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	h := awaitList(ctx, t, stream, plugin, "32 healthy replicas", func(h map[string]bool) bool { return len(h) == 32 && countHealthy(h) == 32 })
	// The state is set just after kubelet's Register returns.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok, msg := plugin.State()
		if ok && strings.Contains(msg, "8 GPUs, 8 healthy, each time-sliced as 4 devices") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state registered=%v %q, want 8 GPUs each time-sliced as 4 devices", ok, msg)
		}
	}
	snap := mon.Last().Snapshot
	uuid0, uuid3 := snap.ByIndex(0).UUID, snap.ByIndex(3).UUID
	for _, g := range snap.GPUs {
		for r := range 4 {
			if id := fmt.Sprintf("%s::%d", g.UUID, r); !h[id] {
				t.Errorf("device %s missing or unhealthy in %v", id, h)
			}
		}
	}

	pr, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: slices.Sorted(maps.Keys(h)), AllocationSize: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	gpuOf := func(id string) string { uuid, _, _ := strings.Cut(id, "::"); return uuid }
	if got := pr.ContainerResponses[0].DeviceIDs; len(got) != 2 || gpuOf(got[0]) == gpuOf(got[1]) {
		t.Errorf("preferred %v, want replicas of two GPUs", got)
	}

	ar, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{uuid3 + "::1", uuid3 + "::2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := ar.ContainerResponses[0]
	_, annotated, err := cdiapi.ParseAnnotations(cr.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	want := "nvidia.com/gpu=" + uuid3
	if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != want || !slices.Equal(annotated, []string{want}) {
		t.Errorf("Allocate of two replicas of gpu3 = %+v, want the one CDI device %s", cr, want)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{uuid0}}}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not a time-slicing replica ID") {
		t.Errorf("Allocate of a plain UUID under time-slicing = %v, want InvalidArgument naming the ID form", err)
	}

	injectXID79(t, s, 3)
	h = awaitList(ctx, t, stream, plugin, "gpu3's replicas Unhealthy after XID 79", func(h map[string]bool) bool { return len(h) == 32 && countHealthy(h) == 28 })
	for id, ok := range h {
		if gpu3 := strings.HasPrefix(id, uuid3+"::"); ok == gpu3 {
			t.Errorf("device %s healthy=%v after XID 79 on gpu3", id, ok)
		}
	}
}

// injectXID79 injects XID 79 on GPU phys once the monitor's NVML event watch has
// registered for it: the watch starts in its own goroutine, and an XID injected
// before it registers reaches no one (on a loaded host that took longer than the
// test's first wait, and the XID was lost).
func injectXID79(t *testing.T, s *sim.Sim, phys int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !s.Watched(phys, nvml.EventTypeXidCriticalError); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no NVML event watch registered for XIDs on gpu%d after 30 s", phys)
		}
	}
	if _, err := s.Inject(sim.Fault{Kind: sim.KindXID, GPU: phys, Value: 79}, 0); err != nil {
		t.Fatal(err)
	}
}

// awaitList reads ListAndWatch lists from stream until want(health by device ID) holds.
func awaitList(ctx context.Context, t *testing.T, stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse], plugin *Plugin, what string, want func(healthy map[string]bool) bool) map[string]bool {
	t.Helper()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	got := make(chan map[string]bool, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				close(got)
				return
			}
			h := map[string]bool{}
			for _, d := range r.Devices {
				h[d.ID] = d.Health == pluginapi.Healthy
			}
			if want(h) {
				got <- h
				return
			}
		}
	}()
	select {
	case h, ok := <-got:
		if !ok {
			t.Fatalf("%s: ListAndWatch stream ended", what)
		}
		return h
	case <-wctx.Done():
		t.Fatalf("%s: not seen within 30 s; devices now %+v", what, plugin.Devices())
		return nil
	}
}

// countHealthy is the number of healthy devices in h.
func countHealthy(h map[string]bool) int {
	n := 0
	for _, ok := range h {
		if ok {
			n++
		}
	}
	return n
}

// A CDI spec that cannot be written keeps the plugin from registering: Run returns the
// error, State says why, and kubelet never sees a registration.
func TestPluginDoesNotRegisterWithoutCDISpec(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, mon, dir, kubelet := simRig(t, ctx, 0)
	plugin := New(Config{Monitor: mon, Dir: dir, Simulated: true, Poll: 100 * time.Millisecond,
		CDI: func(context.Context, []GPU) error {
			return errors.New("write /var/run/cdi/gpurack-simulated.yaml: read-only file system")
		}})
	err := plugin.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "CDI spec") || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("Run = %v, want the CDI error", err)
	}
	if ok, msg := plugin.State(); ok || !strings.Contains(msg, "not registering") || !strings.Contains(msg, "read-only") {
		t.Errorf("state registered=%v %q", ok, msg)
	}
	select {
	case r := <-kubelet.regs:
		t.Errorf("registered %+v without a CDI spec", r)
	default:
	}
	if _, err := os.Stat(filepath.Join(dir, SocketName)); !os.IsNotExist(err) {
		t.Errorf("plugin socket: %v", err)
	}
}

// Package deviceplugin is the agent's Kubernetes device plugin (kubelet's
// deviceplugin/v1beta1 API): it advertises the node's GPUs as nvidia.com/gpu, with the
// GPU UUIDs as device IDs and each GPU's health from the agent's own checks, so that a
// single bad GPU costs one GPU rather than the node.
//
// The decisions are pure functions in devices.go (Remember, Decide, Preferred,
// Allocate); Plugin is the edge: the gRPC server on a unix socket in kubelet's
// device-plugins directory, the Registration call on kubelet.sock, and a watch that
// registers again when kubelet restarts (kubelet.sock recreated).
//
// Allocate names the GPUs as CDI devices (nvidia.com/gpu=UUID); the spec that defines
// them is agent/cdi's, written through Config.CDI before the plugin registers.
//
// With time-slicing (Config.Replicas, the profile's gpu.sharing.timeSlicing.replicas)
// every GPU is advertised as that many devices, <UUID>::0 to <UUID>::<N-1>, each with
// its GPU's health; containers given replicas of one GPU share it with no memory or
// fault isolation. The node taint is not the plugin's: whole-node problems stay
// agent/kubejoin's.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// SocketName is the plugin's socket in the device-plugins directory.
const SocketName = "gpurack-nvidia-gpu.sock"

// ErrNoGPU is Run's answer on a node whose first checklist found no GPU with a UUID.
var ErrNoGPU = errors.New("device plugin: the first checklist found no GPU with a UUID; nothing to advertise as " + nodecontract.ResourceGPU)

// Config configures a Plugin.
type Config struct {
	// Monitor is the agent's check loop: its latest snapshot and published health.
	Monitor *monitor.Monitor
	// Dir is kubelet's device-plugins directory; empty: /var/lib/kubelet/device-plugins/.
	Dir string
	// Simulated selects the simulator's Allocate answer (see Allocate).
	Simulated bool
	// Replicas is how many devices each GPU is advertised as (time-slicing, the
	// profile's gpu.sharing.timeSlicing.replicas); 0 or 1: one per GPU, by UUID.
	Replicas int
	// NUMANode maps an NVML PCI bus id to its NUMA node (-1 unknown); nil: SysfsNUMANode
	// on real GPUs, unknown on the simulator.
	NUMANode func(busID string) int
	// CDI writes the node's CDI spec (agent/cdi) for the GPUs the first checklist found,
	// before the plugin first registers: Allocate names devices the spec must define.
	// When it fails the plugin does not register; Run returns the error and State says
	// why. nil: no spec is written (tests).
	CDI func(ctx context.Context, gpus []GPU) error
	// Poll is how often kubelet.sock is checked for being recreated; default 1 s.
	Poll time.Duration
	Log  *slog.Logger
}

// Plugin serves the device plugin API. Run it; its methods are safe for concurrent use.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	cfg Config

	mu      sync.Mutex
	known   []GPU
	devs    []Device
	changed chan struct{} // closed and replaced when devs changes
	state   string
	regs    int
}

// New returns a Plugin; Run starts it.
func New(cfg Config) *Plugin {
	if cfg.Dir == "" {
		cfg.Dir = pluginapi.DevicePluginPath
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.NUMANode == nil && !cfg.Simulated {
		cfg.NUMANode = SysfsNUMANode
	}
	return &Plugin{cfg: cfg, changed: make(chan struct{}), state: "waiting for the first checklist"}
}

// Devices returns the device list kubelet was last sent.
func (p *Plugin) Devices() []Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Device(nil), p.devs...)
}

// State says what the plugin is doing, for the node service's status.
func (p *Plugin) State() (registered bool, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.regs > 0, p.state
}

// Registrations is how many times the plugin has registered with kubelet (once per
// kubelet start it saw).
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.regs
}

func (p *Plugin) setState(format string, args ...any) {
	p.mu.Lock()
	p.state = fmt.Sprintf(format, args...)
	p.mu.Unlock()
}

// refresh recomputes the device list from the monitor and wakes ListAndWatch streams
// when it changed.
func (p *Plugin) refresh() {
	last := p.cfg.Monitor.Last()
	if last == nil {
		return
	}
	sum := p.cfg.Monitor.Health()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.known = Remember(p.known, &last.Snapshot, p.cfg.NUMANode)
	devs := Decide(p.known, &last.Snapshot, sum)
	if equalDevices(devs, p.devs) {
		return
	}
	for _, d := range devs {
		was := findDevice(p.devs, d.UUID)
		if was == nil || was.Healthy != d.Healthy {
			if d.Healthy {
				p.cfg.Log.Info("device plugin: GPU healthy", "gpu", d.Index, "uuid", d.UUID)
			} else {
				p.cfg.Log.Warn("device plugin: GPU unhealthy", "gpu", d.Index, "uuid", d.UUID, "reason", d.Reason)
			}
		}
	}
	p.devs = devs
	close(p.changed)
	p.changed = make(chan struct{})
}

func findDevice(devs []Device, uuid string) *Device {
	for i := range devs {
		if devs[i].UUID == uuid {
			return &devs[i]
		}
	}
	return nil
}

func equalDevices(a, b []Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Run waits for the agent's first checklist, then serves and registers with kubelet,
// and again each time kubelet restarts, until ctx ends. It returns ErrNoGPU when the
// node has no GPU to advertise; failures to serve or register are retried.
func (p *Plugin) Run(ctx context.Context) error {
	go monitor.Follow(ctx, p.cfg.Monitor.Broker(), func(e monitor.Event) {
		if e.Health != nil || e.Check != nil {
			p.refresh()
		}
	}, p.refresh)
	for p.cfg.Monitor.Last() == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	p.refresh()
	if len(p.Devices()) == 0 {
		p.setState("no GPU to advertise")
		return ErrNoGPU
	}
	if p.cfg.CDI != nil {
		var gpus []GPU
		for _, d := range p.Devices() {
			gpus = append(gpus, d.GPU)
		}
		if err := p.cfg.CDI(ctx, gpus); err != nil {
			p.setState("not registering %s with kubelet: the CDI spec could not be written: %v", nodecontract.ResourceGPU, err)
			return fmt.Errorf("device plugin not registered: the CDI spec could not be written: %w", err)
		}
	}
	for ctx.Err() == nil {
		if err := p.serveOnce(ctx); err != nil {
			p.cfg.Log.Warn("device plugin: serving failed; retrying", "error", err)
			p.setState("%v; retrying", err)
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}
	return nil
}

// serveOnce serves on a fresh socket, registers, and returns once kubelet.sock was
// recreated (kubelet restarted and removed every socket in the directory) or our own
// socket went away, or ctx ended.
func (p *Plugin) serveOnce(ctx context.Context) error {
	sock := filepath.Join(p.cfg.Dir, SocketName)
	kubeletSock := filepath.Join(p.cfg.Dir, filepath.Base(pluginapi.KubeletSocket))
	// kubelet must be there first: it removes the plugin sockets when it starts.
	kid, err := p.waitKubelet(ctx, kubeletSock)
	if err != nil {
		return nil // ctx ended
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	gs := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(gs, p)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(l) }()
	defer func() {
		gs.Stop()
		<-served
		os.Remove(sock)
	}()
	if err := p.register(ctx, kubeletSock); err != nil {
		return err
	}
	p.mu.Lock()
	p.regs++
	n, healthy := len(p.devs), Healthy(p.devs)
	p.state = fmt.Sprintf("registered %s with kubelet (%s): %d GPUs, %d healthy", nodecontract.ResourceGPU, kubeletSock, n, healthy)
	if p.cfg.Replicas > 1 {
		p.state += fmt.Sprintf(", each time-sliced as %d devices", p.cfg.Replicas)
	}
	p.mu.Unlock()
	p.cfg.Log.Info("device plugin registered with kubelet", "resource", nodecontract.ResourceGPU, "socket", sock, "gpus", n, "healthy", healthy, "replicas", max(p.cfg.Replicas, 1))
	t := time.NewTicker(p.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			served <- err // for the deferred stop
			return fmt.Errorf("device plugin gRPC on %s: %w", sock, err)
		case <-t.C:
		}
		if id, err := fileID(kubeletSock); err != nil || id != kid {
			p.cfg.Log.Info("kubelet.sock recreated or gone (kubelet restarted); registering again", "socket", kubeletSock)
			return nil
		}
		if _, err := os.Stat(sock); err != nil {
			p.cfg.Log.Info("device plugin socket removed; serving and registering again", "socket", sock)
			return nil
		}
	}
}

// waitKubelet waits until kubelet.sock exists and returns its identity.
func (p *Plugin) waitKubelet(ctx context.Context, path string) (fileKey, error) {
	logged := false
	for {
		if id, err := fileID(path); err == nil {
			return id, nil
		}
		if !logged {
			p.setState("waiting for kubelet's %s", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fileKey{}, ctx.Err()
		case <-time.After(p.cfg.Poll):
		}
	}
}

// fileKey identifies one file: a recreated kubelet.sock has a new inode or ctime.
type fileKey struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

func fileID(path string) (fileKey, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileKey{}, err
	}
	return fileKey{uint64(st.Dev), st.Ino, st.Ctim}, nil
}

// register calls kubelet's Registration service (deviceplugin/v1beta1 Register).
func (p *Plugin) register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("kubelet registration socket %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: SocketName, ResourceName: nodecontract.ResourceGPU,
		Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}})
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", nodecontract.ResourceGPU, kubeletSock, err)
	}
	return nil
}

// GetDevicePluginOptions implements DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the device list at once and again whenever it changes.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		p.mu.Lock()
		devs, changed := p.devs, p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: toAPI(devs, p.cfg.Replicas)}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation implements DevicePluginServer with Preferred.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	devs := p.Devices()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: Preferred(devs, p.cfg.Replicas, cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))})
	}
	return resp, nil
}

// Allocate implements DevicePluginServer with Allocate.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devs := p.Devices()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		a, err := Allocate(devs, p.cfg.Replicas, cr.GetDevicesIds(), p.cfg.Simulated)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: a.Envs, CdiDevices: a.CDIDevices, Annotations: a.Annotations})
	}
	return resp, nil
}

// PreStartContainer implements DevicePluginServer; the plugin asks for no call.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Command kubelet-stub is the kubelet side of the device-plugin API, for measuring a
// device plugin without a kubelet (hack/agent-cpu.sh -k): it serves Registration on
// DIR/kubelet.sock as kubelet's device manager does, and for each plugin that
// registers it keeps ListAndWatch open (printing each device list) and, every
// --allocate-every, asks GetPreferredAllocation and Allocate for --size devices, as
// kubelet does when it admits a pod. It is a stand-in named in docs/testing.md, not
// kubelet: no pods, no checkpoint, no topology manager.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	ctx   context.Context
	dir   string
	every time.Duration
	size  int
}

func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	fmt.Printf("kubelet-stub: %s registered at %s (API %s)\n", req.ResourceName, req.Endpoint, req.Version)
	go r.follow(req)
	return &pluginapi.Empty{}, nil
}

// follow keeps ListAndWatch open and allocates from the healthy devices.
func (r *registration) follow(req *pluginapi.RegisterRequest) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Printf("kubelet-stub: dial %s: %v", req.Endpoint, err)
		return
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	stream, err := c.ListAndWatch(r.ctx, &pluginapi.Empty{})
	if err != nil {
		log.Printf("kubelet-stub: ListAndWatch: %v", err)
		return
	}
	healthy := make(chan []string, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				log.Printf("kubelet-stub: ListAndWatch ended: %v", err)
				return
			}
			var ids []string
			for _, d := range resp.Devices {
				if d.Health == pluginapi.Healthy {
					ids = append(ids, d.ID)
				}
			}
			fmt.Printf("kubelet-stub: %d devices, %d healthy\n", len(resp.Devices), len(ids))
			select {
			case <-healthy:
			default:
			}
			healthy <- ids
		}
	}()
	var ids []string
	calls := 0
	tick := time.NewTicker(r.every)
	defer tick.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case ids = <-healthy:
			continue
		case <-tick.C:
		}
		if len(ids) < r.size {
			continue
		}
		pref, err := c.GetPreferredAllocation(r.ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: ids, AllocationSize: int32(r.size)}}})
		if err != nil {
			log.Printf("kubelet-stub: GetPreferredAllocation: %v", err)
			continue
		}
		got := pref.ContainerResponses[0].DeviceIDs
		if _, err := c.Allocate(r.ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: got}}}); err != nil {
			log.Printf("kubelet-stub: Allocate %v: %v", got, err)
			continue
		}
		if calls++; calls == 1 {
			fmt.Printf("kubelet-stub: allocating %d devices every %s (first: %v)\n", r.size, r.every, got)
		}
	}
}

func main() {
	dir := flag.String("dir", "/var/lib/kubelet/device-plugins", "the device-plugins directory: kubelet.sock is served there")
	every := flag.Duration("allocate-every", time.Second, "how often to allocate, as kubelet admitting a pod")
	size := flag.Int("size", 2, "devices per allocation")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	sock := filepath.Join(*dir, "kubelet.sock")
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatalf("kubelet-stub: %v", err)
	}
	gs := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(gs, &registration{ctx: ctx, dir: *dir, every: *every, size: *size})
	go func() { <-ctx.Done(); gs.Stop() }()
	fmt.Printf("kubelet-stub: serving Registration on %s\n", sock)
	if err := gs.Serve(l); err != nil {
		log.Fatal(err)
	}
}

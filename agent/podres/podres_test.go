package podres

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeKubelet serves the pod-resources List on a real unix socket, as kubelet does.
type fakeKubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp  *podresourcesapi.ListPodResourcesResponse
	calls atomic.Int32
}

func (k *fakeKubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.calls.Add(1)
	return k.resp, nil
}

func serve(t *testing.T, k *fakeKubelet) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpr-podres-") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := Socket(dir)
	os.MkdirAll(filepath.Dir(sock), 0o755)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(gs, k)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return sock
}

func dev(resource string, ids ...string) *podresourcesapi.ContainerDevices {
	return &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

// List maps GPUs to their holders: whole GPUs by UUID, time-slicing replicas to their
// GPU (each holder once), other resources ignored; the cache answers from one call.
func TestList(t *testing.T) {
	k := &fakeKubelet{resp: &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Name: "train-0", Namespace: "team-a", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{dev("nvidia.com/gpu", "GPU-1", "GPU-2")}},
			{Name: "sidecar", Devices: []*podresourcesapi.ContainerDevices{dev("example.com/nic", "nic0")}},
		}},
		{Name: "infer-1", Namespace: "team-b", Containers: []*podresourcesapi.ContainerResources{
			{Name: "server", Devices: []*podresourcesapi.ContainerDevices{dev("nvidia.com/gpu", "GPU-3::0", "GPU-3::1")}},
		}},
		{Name: "infer-0", Namespace: "team-b", Containers: []*podresourcesapi.ContainerResources{
			{Name: "server", Devices: []*podresourcesapi.ContainerDevices{dev("nvidia.com/gpu", "GPU-3::2")}},
		}},
		{Name: "idle", Namespace: "team-a", Containers: []*podresourcesapi.ContainerResources{{Name: "main"}}},
	}}}
	sock := serve(t, k)
	got, err := List(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	want := Holders{
		"GPU-1": {{"team-a", "train-0", "main"}},
		"GPU-2": {{"team-a", "train-0", "main"}},
		"GPU-3": {{"team-b", "infer-0", "server"}, {"team-b", "infer-1", "server"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}

	c := &Cache{Socket: sock, MaxAge: time.Hour}
	for range 3 {
		if h, err := c.Holders(context.Background()); err != nil || !reflect.DeepEqual(h, want) {
			t.Fatalf("Cache.Holders = %v, %v", h, err)
		}
	}
	if n := k.calls.Load(); n != 2 {
		t.Errorf("kubelet got %d List calls for one List and three cached reads, want 2", n)
	}

	if _, err := List(context.Background(), filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, ErrNoKubelet) {
		t.Errorf("List without a socket: %v, want ErrNoKubelet", err)
	}
}

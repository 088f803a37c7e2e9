package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpurack/gpurack/agent/cdi"
	gpunvml "github.com/gpurack/gpurack/agent/gpu/nvml"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The plugin over real GPUs (hack/gpu-check.sh runs this on a machine with an NVIDIA
// driver; elsewhere it does not apply): the agent's NVML backend and monitor, the CDI
// spec from nvcdi written and validated before registration, registration with a
// kubelet-side stub, a ListAndWatch listing exactly NVML's GPUs by UUID, and Allocate
// and GetPreferredAllocation answering for them without any simulation label.
// GPURACK_NVML_LIBRARY names libnvidia-ml.so.1 (default: the loader's search) and
// GPURACK_GPU_CHECK_PROFILE the profile (default: debian13-nvidia550); each GPU's
// health is logged, not asserted, since the profile need not describe the machine.
func TestPluginOnNVML(t *testing.T) {
	b := gpunvml.Open(os.Getenv("GPURACK_NVML_LIBRARY"))
	defer b.Close()
	lib, err := b.Library()
	if err != nil {
		if _, serr := os.Stat("/dev/nvidiactl"); serr != nil {
			testreq.NotApplicable(t, "no NVIDIA driver on this machine ("+err.Error()+"); hack/gpu-check.sh runs this where there is one")
		}
		t.Fatalf("NVML: %v (GPURACK_NVML_LIBRARY names libnvidia-ml.so.1)", err)
	}
	profilePath := os.Getenv("GPURACK_GPU_CHECK_PROFILE")
	if profilePath == "" {
		profilePath = "../../profiles/debian13-nvidia550.yaml"
	}
	p, err := profile.Load(profilePath)
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	n, _ := lib.DeviceGetCount()
	for i := range n {
		d, _ := lib.DeviceGetHandleByIndex(i)
		u, _ := d.GetUUID()
		uuids = append(uuids, u)
	}
	slices.Sort(uuids)
	t.Logf("NVML: %d GPUs %v", n, uuids)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mon := monitor.New(monitor.Config{Backend: b, Profile: p, Interval: time.Second})
	go mon.Run(ctx)
	dir, err := os.MkdirTemp("", "gpr-dp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kubelet := startKubelet(t, dir)
	specDir := filepath.Join(dir, "cdi")
	var specNames []string
	plugin := New(Config{Monitor: mon, Dir: dir, Poll: 100 * time.Millisecond,
		CDI: func(ctx context.Context, _ []GPU) error {
			path, err := cdi.WriteNVML(ctx, cdi.NVMLOptions{NVML: lib, Dir: specDir})
			if err != nil {
				return err
			}
			specNames, err = cdi.DeviceNames(path)
			return err
		}})
	go plugin.Run(ctx)
	reg := kubelet.waitRegistration(t)
	t.Logf("registered %s on %s; CDI spec devices %v", reg.ResourceName, reg.Endpoint, specNames)
	for _, u := range uuids {
		if !slices.Contains(specNames, cdi.QualifiedName(u)) {
			t.Errorf("the CDI spec has no device %s", cdi.QualifiedName(u))
		}
	}

	client := dialPlugin(t, filepath.Join(dir, reg.Endpoint))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Devices {
		ids = append(ids, d.ID)
		t.Logf("device %s: %s (NUMA %v)", d.ID, d.Health, d.GetTopology().GetNodes())
	}
	slices.Sort(ids)
	if !slices.Equal(ids, uuids) {
		t.Fatalf("ListAndWatch lists %v, NVML has %v", ids, uuids)
	}
	for _, d := range plugin.Devices() {
		if !d.Healthy {
			t.Logf("GPU %d %s unhealthy: %s", d.Index, d.UUID, d.Reason)
		}
	}
	pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: ids, AllocationSize: 1}}})
	if err != nil || len(pref.ContainerResponses[0].DeviceIDs) != 1 {
		t.Errorf("GetPreferredAllocation of 1: %v %v", pref, err)
	}
	ar, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids[:1]}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := ar.ContainerResponses[0]
	if len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != cdi.QualifiedName(ids[0]) || cr.Annotations[cdi.SimulatedAnnotation] != "" || cr.Envs[cdi.SimulatedEnv] != "" {
		t.Errorf("Allocate of %s = %+v", ids[0], cr)
	}
	t.Logf("Allocate of %s: CDI devices %v, annotations %v", ids[0], cr.CdiDevices, cr.Annotations)
}

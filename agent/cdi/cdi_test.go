package cdi

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/internal/testreq"
)

// simGPUs are a simulated DGX H100's eight GPUs as the agent sees them.
func simGPUs(t *testing.T) ([]GPU, *sim.Sim) {
	t.Helper()
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: "535.183.01"})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := s.Library()
	if err != nil {
		t.Fatal(err)
	}
	n, _ := lib.DeviceGetCount()
	var gpus []GPU
	for i := range n {
		d, _ := lib.DeviceGetHandleByIndex(i)
		uuid, _ := d.GetUUID()
		gpus = append(gpus, GPU{UUID: uuid, Index: i})
	}
	if len(gpus) != 8 {
		t.Fatalf("the simulator has %d GPUs, want 8", len(gpus))
	}
	return gpus, s
}

// inject resolves names with the CDI library's cache over dir, as containerd 1.7 and
// nvidia-container-runtime do, and returns the OCI spec it edited.
func inject(t *testing.T, dir string, names ...string) (*oci.Spec, error) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache over %s: %v", dir, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	s := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	_, err = cache.InjectDevices(s, names...)
	return s, err
}

func devicePaths(s *oci.Spec) []string {
	var out []string
	for _, d := range s.Linux.Devices {
		out = append(out, d.Path)
	}
	slices.Sort(out)
	return out
}

// The simulated spec passes the CDI library's parser and validation, and injecting
// nvidia.com/gpu=<uuid of gpu3> and =5 the way containerd does gives the container
// exactly /dev/nvidia3, /dev/nvidia5, /dev/nvidiactl and /dev/nvidia-uvm, each from
// the simulated directory as the null device, with GPURACK_SIMULATED_GPUS=true.
func TestSimSpecValidatesAndMapsDevices(t *testing.T) {
	gpus, _ := simGPUs(t)
	devDir := "/run/gpurack/sim-dev"
	data, err := Marshal(SimSpec(gpus, devDir))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Validate(data)
	if err != nil {
		t.Fatalf("the CDI library rejects the simulated spec: %v\n%s", err, data)
	}
	if spec.Kind != "nvidia.com/gpu" {
		t.Errorf("kind %q", spec.Kind)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	for _, g := range gpus {
		for _, n := range []string{g.UUID, strconv.Itoa(g.Index)} {
			if !slices.Contains(names, n) {
				t.Errorf("no device %q in %v", n, names)
			}
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, SimulatedFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := inject(t, dir, QualifiedName(gpus[3].UUID), QualifiedName("5"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := devicePaths(s), []string{"/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("container devices %v, want %v", got, want)
	}
	for _, d := range s.Linux.Devices {
		if d.Type != "c" || d.Major != SimMajor || d.Minor != SimMinor {
			t.Errorf("container device %s is %s %d:%d, want the null device c 1:3", d.Path, d.Type, d.Major, d.Minor)
		}
	}
	if !slices.Contains(s.Process.Env, "GPURACK_SIMULATED_GPUS=true") {
		t.Errorf("container env %v lacks GPURACK_SIMULATED_GPUS=true", s.Process.Env)
	}
	if _, err := inject(t, dir, QualifiedName("GPU-not-on-this-node")); err == nil {
		t.Error("an unknown device was injected")
	}
}

// Nothing simulated can pass for real: every device node of the simulated spec comes
// from the simulated directory and is the null device, the spec and each device carry
// gpurack.io/simulated, its file is not nvidia.yaml, and CheckReal (which guards
// nvidia.yaml) refuses it, naming each sign.
func TestNothingSimulatedPassesForReal(t *testing.T) {
	gpus, _ := simGPUs(t)
	devDir := "/run/gpurack/sim-dev"
	spec := SimSpec(gpus, devDir)
	if SimulatedFile == NVIDIAFile || !strings.Contains(SimulatedFile, "simulated") {
		t.Errorf("simulated spec file %q", SimulatedFile)
	}
	if spec.Annotations[SimulatedAnnotation] != "true" {
		t.Errorf("spec annotations %v", spec.Annotations)
	}
	nodes := slices.Clone(spec.ContainerEdits.DeviceNodes)
	for _, d := range spec.Devices {
		if d.Annotations[SimulatedAnnotation] != "true" {
			t.Errorf("device %s annotations %v", d.Name, d.Annotations)
		}
		nodes = append(nodes, d.ContainerEdits.DeviceNodes...)
	}
	for _, n := range nodes {
		if !strings.HasPrefix(n.HostPath, devDir+"/") || n.Major != SimMajor || n.Minor != SimMinor || n.Type != "c" {
			t.Errorf("device node %+v is not a null device from %s", n, devDir)
		}
	}
	err := CheckReal(spec, devDir)
	if err == nil {
		t.Fatal("CheckReal accepted the simulated spec")
	}
	for _, want := range []string{"the spec carries gpurack.io/simulated", "GPURACK_SIMULATED_GPUS=true", devDir + "/nvidia0", "device all carries"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckReal error lacks %q: %v", want, err)
		}
	}
	// One sign alone is enough.
	one := &specs.Spec{Kind: Kind, Devices: []specs.Device{{Name: "0", ContainerEdits: specs.ContainerEdits{
		DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia0", HostPath: devDir + "/nvidia0"}}}}}}
	if CheckReal(one, devDir) == nil {
		t.Error("CheckReal accepted a device node from the simulated directory")
	}
	one.Devices[0].ContainerEdits.DeviceNodes[0].HostPath = "/dev/nvidia0"
	if err := CheckReal(one, devDir); err != nil {
		t.Errorf("CheckReal refused a real-looking spec: %v", err)
	}
}

// WriteSimulated makes the device nodes as character devices 1:3, mode 0666, replacing
// a wrong file; writes a spec that validates; and refuses to run beside a real
// nvidia.yaml.
func TestWriteSimulatedMakesNullNodes(t *testing.T) {
	testreq.Root(t, "mknod of the simulated device nodes needs CAP_MKNOD")
	gpus, _ := simGPUs(t)
	dir, devDir := t.TempDir(), filepath.Join(t.TempDir(), "sim-dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(devDir, "nvidia2"), []byte("not a device"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run finds everything in place
		path, err := WriteSimulated(context.Background(), SimOptions{Dir: dir, DevDir: devDir, GPUs: gpus})
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(dir, SimulatedFile) {
			t.Errorf("path %s", path)
		}
	}
	for _, name := range SimNodes(gpus) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(devDir, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(uint64(st.Rdev)) != SimMajor || unix.Minor(uint64(st.Rdev)) != SimMinor || st.Mode&0o777 != 0o666 {
			t.Errorf("%s: mode %o rdev %d:%d, want a character device 1:3 mode 666", name, st.Mode, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
		}
	}
	if len(SimNodes(gpus)) != 10 {
		t.Errorf("nodes %v", SimNodes(gpus))
	}
	data, err := os.ReadFile(filepath.Join(dir, SimulatedFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Validate(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, NVIDIAFile), []byte("---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteSimulated(context.Background(), SimOptions{Dir: dir, DevDir: devDir, GPUs: gpus}); err == nil || !strings.Contains(err.Error(), "real GPU spec") {
		t.Errorf("WriteSimulated beside nvidia.yaml = %v", err)
	}
}

// fakeDriverRoot lays out what nvcdi looks for on a real node: the driver's versioned
// libraries (empty files) and the device nodes. The device nodes are null devices
// (1:3): simulation standing in for a GPU driver, which this machine has not.
func fakeDriverRoot(t *testing.T, version string, gpus int) string {
	t.Helper()
	root := t.TempDir()
	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"} {
		if err := os.WriteFile(filepath.Join(libDir, lib+"."+version), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []string
	for i := range gpus {
		nodes = append(nodes, "nvidia"+strconv.Itoa(i))
	}
	if err := MakeSimNodes(filepath.Join(root, "dev"), append(nodes, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")); err != nil {
		t.Fatal(err)
	}
	return root
}

// completeMock answers the NVML calls nvcdi makes that the simulator's mock leaves
// unset, as a GPU without MIG does.
func completeMock(t *testing.T, lib nvml.Interface) {
	t.Helper()
	n, _ := lib.DeviceGetCount()
	for i := range n {
		h, _ := lib.DeviceGetHandleByIndex(i)
		d, ok := h.(*sim.Device)
		if !ok {
			t.Fatalf("simulated device %d is %T", i, h)
		}
		d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	}
}

// The NVML path, on go-nvml's mock (the agent's simulator, a DGX H100) with a fake
// driver root, since no real GPU was available: this is simulation standing in for
// NVML. nvcdi's spec names every GPU by UUID and by index, validates with the CDI
// library, passes CheckReal, is written as nvidia.yaml (removing a stale simulated
// spec), and injecting a GPU by UUID gives its /dev/nvidiaN with the control nodes
// and the driver's libraries.
func TestNVMLSpecOnMockedNVML(t *testing.T) {
	testreq.Root(t, "mknod of the fake driver root's device nodes needs CAP_MKNOD")
	gpus, s := simGPUs(t)
	lib, err := s.Library()
	if err != nil {
		t.Fatal(err)
	}
	completeMock(t, lib)
	root := fakeDriverRoot(t, "535.183.01", len(gpus))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, SimulatedFile), []byte("---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path, err := WriteNVML(context.Background(), NVMLOptions{Dir: dir, NVML: lib, DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, NVIDIAFile) {
		t.Errorf("path %s", path)
	}
	if _, err := os.Stat(filepath.Join(dir, SimulatedFile)); !os.IsNotExist(err) {
		t.Errorf("stale simulated spec left beside nvidia.yaml: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Validate(data)
	if err != nil {
		t.Fatalf("the CDI library rejects nvcdi's spec: %v\n%s", err, data)
	}
	if err := CheckReal(spec, ""); err != nil {
		t.Error(err)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	for _, g := range gpus {
		for _, n := range []string{g.UUID, strconv.Itoa(g.Index)} {
			if !slices.Contains(names, n) {
				t.Errorf("no device %q in %v", n, names)
			}
		}
	}
	if !slices.Contains(names, "all") {
		t.Errorf("no device all in %v", names)
	}
	if !strings.Contains(string(data), HookPath) {
		t.Errorf("the spec's hooks do not run %s:\n%s", HookPath, data)
	}
	o, err := inject(t, dir, QualifiedName(gpus[6].UUID))
	if err != nil {
		t.Fatal(err)
	}
	devs := devicePaths(o)
	for _, want := range []string{"/dev/nvidia6", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if !slices.Contains(devs, want) {
			t.Errorf("container devices %v lack %s", devs, want)
		}
	}
	if slices.Contains(devs, "/dev/nvidia5") {
		t.Errorf("container devices %v include another GPU", devs)
	}
	var mounts []string
	for _, m := range o.Mounts {
		mounts = append(mounts, m.Destination)
	}
	if !slices.ContainsFunc(mounts, func(m string) bool { return strings.HasSuffix(m, "libcuda.so.535.183.01") }) {
		t.Errorf("container mounts %v lack libcuda", mounts)
	}
}

// Without NVML there is no spec, and the error says so.
func TestNVMLSpecNeedsNVML(t *testing.T) {
	var lib nvml.Interface
	if _, err := GenerateNVML(NVMLOptions{NVML: lib}); err == nil || !strings.Contains(err.Error(), "NVML") {
		t.Errorf("GenerateNVML without NVML = %v", err)
	}
}

// A spec that cannot be written is an error that names the directory.
func TestWriteFailsOnUnwritableDir(t *testing.T) {
	gpus, _ := simGPUs(t)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := write(filepath.Join(file, SimulatedFile), SimSpec(gpus, SimDevDir))
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("write under a file = %v", err)
	}
}

// Validate takes any bytes (a spec file found on the node) without panicking.
func FuzzValidate(f *testing.F) {
	gpus := []GPU{{UUID: "GPU-0f5e2a4c-1b2d-4e6f-8a9b-0c1d2e3f4a5b", Index: 0}}
	data, err := Marshal(SimSpec(gpus, SimDevDir))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("---\ncdiVersion: 0.3.0\nkind: nvidia.com/gpu\ndevices: []\n"))
	f.Add([]byte("cdiVersion: 99.0.0\nkind: x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := Validate(data); err == nil && s == nil {
			t.Fatal("no error and no spec")
		}
	})
}

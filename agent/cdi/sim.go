package cdi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// The simulated device nodes are character devices with the kernel's null device
// number (1:3): reads see end of file, writes are discarded, ioctls fail with ENOTTY.
// Nothing a container does with them reaches any hardware, and the device cgroup of
// every container allows 1:3 already.
const (
	SimMajor = 1
	SimMinor = 3
	simMode  = 0o666
)

// GPU is one simulated GPU: the UUID and index its CDI devices are named by.
type GPU struct {
	UUID  string
	Index int
}

// SimNodes are the device node names the simulation makes for gpus GPUs, as in /dev:
// nvidia0..gpus-1, nvidiactl, nvidia-uvm.
func SimNodes(gpus []GPU) []string {
	var out []string
	for _, g := range gpus {
		out = append(out, "nvidia"+strconv.Itoa(g.Index))
	}
	return append(out, "nvidiactl", "nvidia-uvm")
}

// SimSpec is the simulated GPUs' spec: kind nvidia.com/gpu, a device per GPU by UUID
// and by index and "all", each mapping the node devDir/nvidiaN to /dev/nvidiaN; every
// device also gets /dev/nvidiactl and /dev/nvidia-uvm from devDir. The spec, each
// device and each container's environment say it is simulated.
func SimSpec(gpus []GPU, devDir string) *specs.Spec {
	node := func(name string) *specs.DeviceNode {
		major, minor := int64(SimMajor), int64(SimMinor)
		mode := os.FileMode(simMode)
		return &specs.DeviceNode{Path: "/dev/" + name, HostPath: filepath.Join(devDir, name), Type: "c",
			Major: major, Minor: minor, FileMode: &mode, Permissions: "rw"}
	}
	simulated := map[string]string{SimulatedAnnotation: "true"}
	s := &specs.Spec{
		Kind: Kind,
		Annotations: map[string]string{
			SimulatedAnnotation:                   "true",
			SimulatedAnnotation + "-device-nodes": fmt.Sprintf("character devices %d:%d (the null device) under %s, not GPUs", SimMajor, SimMinor, devDir),
		},
		ContainerEdits: specs.ContainerEdits{
			Env:         []string{SimulatedEnv + "=true", "NVIDIA_VISIBLE_DEVICES=void"},
			DeviceNodes: []*specs.DeviceNode{node("nvidiactl"), node("nvidia-uvm")},
		},
	}
	var all []*specs.DeviceNode
	for _, g := range gpus {
		n := "nvidia" + strconv.Itoa(g.Index)
		all = append(all, node(n))
		for _, name := range []string{g.UUID, strconv.Itoa(g.Index)} {
			s.Devices = append(s.Devices, specs.Device{Name: name, Annotations: simulated,
				ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{node(n)}}})
		}
	}
	s.Devices = append(s.Devices, specs.Device{Name: "all", Annotations: simulated,
		ContainerEdits: specs.ContainerEdits{DeviceNodes: all}})
	return s
}

// SimOptions configure the simulated spec.
type SimOptions struct {
	// Dir is the spec directory; empty: Dir. DevDir holds the device nodes; empty:
	// SimDevDir.
	Dir, DevDir string
	GPUs        []GPU
}

// WriteSimulated makes the simulated device nodes (MakeSimNodes) and writes the
// simulated spec to Dir/gpurack-simulated.yaml. It refuses to run beside a real
// nvidia.yaml, whose devices have the same names. It returns the spec's path.
func WriteSimulated(_ context.Context, o SimOptions) (string, error) {
	dir, devDir := o.Dir, o.DevDir
	if dir == "" {
		dir = Dir
	}
	if devDir == "" {
		devDir = SimDevDir
	}
	if len(o.GPUs) == 0 {
		return "", errors.New("simulated CDI spec: no simulated GPU")
	}
	real := filepath.Join(dir, NVIDIAFile)
	if _, err := os.Stat(real); err == nil {
		return "", fmt.Errorf("simulated CDI spec: %s exists, a real GPU spec with the same device names; a simulated agent does not shadow it (remove it, or run the agent with NVML)", real)
	}
	if err := MakeSimNodes(devDir, SimNodes(o.GPUs)); err != nil {
		return "", err
	}
	path := filepath.Join(dir, SimulatedFile)
	if _, err := write(path, SimSpec(o.GPUs, devDir)); err != nil {
		return "", err
	}
	return path, nil
}

// MakeSimNodes makes each of names in dir as a character device 1:3 with mode 0666,
// replacing whatever else is there under that name. dir is made 0755.
func MakeSimNodes(dir string, names []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("simulated device nodes: %w", err)
	}
	want := unix.Mkdev(SimMajor, SimMinor)
	for _, name := range names {
		path := filepath.Join(dir, name)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && uint64(st.Rdev) == want && st.Mode&0o777 == simMode {
				continue
			}
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("simulated device node %s: %w", path, err)
			}
		}
		if err := unix.Mknod(path, unix.S_IFCHR|simMode, int(want)); err != nil {
			return fmt.Errorf("simulated device node %s: mknod (needs CAP_MKNOD; the agent runs as root): %w", path, err)
		}
		// mknod's mode is trimmed by the umask.
		if err := os.Chmod(path, simMode); err != nil {
			return fmt.Errorf("simulated device node %s: %w", path, err)
		}
	}
	return nil
}

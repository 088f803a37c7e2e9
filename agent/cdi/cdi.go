// Package cdi writes the node's Container Device Interface specs, which containerd (1.7,
// enable_cdi) or nvidia-container-runtime in CDI mode (containerd 1.6) read to give a
// container its GPUs when the device plugin's Allocate names them as nvidia.com/gpu=UUID.
//
//   - On NVML nodes WriteNVML writes /var/run/cdi/nvidia.yaml with nvidia-container-toolkit's
//     pkg/nvcdi: one device per GPU by UUID and one by index, plus "all", with the driver's
//     libraries, binaries and the nvidia-cdi-hook hooks as nvcdi finds them.
//   - In simulation WriteSimulated makes harmless device nodes under /run/gpurack/sim-dev
//     (character devices 1:3, the kernel's null device, mode 0666) and writes
//     /var/run/cdi/gpurack-simulated.yaml, which maps them into the container as
//     /dev/nvidia0..N-1, /dev/nvidiactl and /dev/nvidia-uvm. Everything about it names
//     itself simulation: the file name, the spec's and each device's
//     gpurack.io/simulated annotation, GPURACK_SIMULATED_GPUS=true in the container,
//     and the host paths. CheckReal refuses such a spec as a real one.
//
// Every spec is checked with the CDI library's own parser and validation
// (tags.cncf.io/container-device-interface) before it is written, and written whole
// (internal/atomicfile). The package is not the device plugin (agent/deviceplugin) and
// does not decide which GPUs a container gets.
package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

const (
	// Dir is where the specs go: one of the CDI default spec directories that both
	// containerd and nvidia-container-runtime read.
	Dir = "/var/run/cdi"
	// NVIDIAFile is the real GPUs' spec file in Dir, the name nvidia-ctk gives it.
	NVIDIAFile = "nvidia.yaml"
	// SimulatedFile is the simulated GPUs' spec file in Dir.
	SimulatedFile = "gpurack-simulated.yaml"
	// SimDevDir is where the simulated device nodes are made.
	SimDevDir = "/run/gpurack/sim-dev"

	// Vendor and Class make the kind nvidia.com/gpu that Allocate's device names use.
	Vendor = "nvidia.com"
	Class  = "gpu"
	Kind   = Vendor + "/" + Class

	// SimulatedAnnotation marks the simulated spec and each of its devices.
	SimulatedAnnotation = "gpurack.io/simulated"
	// SimulatedEnv is set to "true" in every container that got simulated GPUs.
	SimulatedEnv = "GPURACK_SIMULATED_GPUS"
)

// QualifiedName is the fully qualified CDI name of the GPU device named name (a UUID or
// an index): nvidia.com/gpu=name.
func QualifiedName(name string) string { return parser.QualifiedName(Vendor, Class, name) }

// Marshal renders spec as the YAML the CDI library writes ("---" first), after setting
// its cdiVersion to the lowest version that can express it, so older CDI readers
// (containerd 1.7's) accept it.
func Marshal(spec *specs.Spec) ([]byte, error) {
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", spec.Kind, err)
	}
	spec.Version = v
	data, err := yaml.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", spec.Kind, err)
	}
	return append([]byte("---\n"), data...), nil
}

// Validate parses data with the CDI library (unknown fields are errors) and runs its
// whole validation (version, kind, device names, container edits), as containerd does
// when it loads a spec directory. It returns the parsed spec.
func Validate(data []byte) (*specs.Spec, error) {
	raw, err := cdiapi.ParseSpec(data)
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, errors.New("empty CDI spec")
	}
	// The library validates what it reads from a file; a private temporary one.
	f, err := os.CreateTemp("", "gpurack-cdi-*.yaml")
	if err != nil {
		return nil, fmt.Errorf("validate CDI spec: %w", err)
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, fmt.Errorf("validate CDI spec: %w", werr)
	}
	s, err := cdiapi.ReadSpec(f.Name(), 0)
	if err != nil {
		return nil, err
	}
	return s.Spec, nil
}

// DeviceNames reads the spec at path, validates it (Validate) and returns its devices'
// fully qualified names (nvidia.com/gpu=NAME), in the spec's order.
func DeviceNames(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	spec, err := Validate(data)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", path, err)
	}
	names := make([]string, len(spec.Devices))
	for i, d := range spec.Devices {
		names[i] = spec.Kind + "=" + d.Name
	}
	return names, nil
}

// write validates spec and writes it to path atomically (mode 0644, parents 0755).
func write(path string, spec *specs.Spec) ([]byte, error) {
	data, err := Marshal(spec)
	if err != nil {
		return nil, err
	}
	if _, err := Validate(data); err != nil {
		return nil, fmt.Errorf("CDI spec for %s fails the CDI library's validation, not writing %s: %w", spec.Kind, path, err)
	}
	if err := atomicfile.WriteMkdirAll(path, data, 0o644, 0o755); err != nil {
		return nil, fmt.Errorf("write the CDI spec %s (the device plugin needs it to give containers GPUs; is %s writable?): %w", path, filepath.Dir(path), err)
	}
	return data, nil
}

// CheckReal fails when spec shows any sign of simulation: a gpurack.io/simulated
// annotation on the spec or a device, GPURACK_SIMULATED_GPUS in an environment, or a
// device node or mount from under simDev (empty: SimDevDir). WriteNVML runs it on what
// nvcdi generated, so nothing simulated is ever written as nvidia.yaml.
func CheckReal(spec *specs.Spec, simDev string) error {
	if simDev == "" {
		simDev = SimDevDir
	}
	var why []string
	if _, ok := spec.Annotations[SimulatedAnnotation]; ok {
		why = append(why, "the spec carries "+SimulatedAnnotation)
	}
	check := func(where string, e specs.ContainerEdits) {
		for _, env := range e.Env {
			if strings.HasPrefix(env, SimulatedEnv+"=") {
				why = append(why, where+" sets "+env)
			}
		}
		for _, d := range e.DeviceNodes {
			p := d.HostPath
			if p == "" {
				p = d.Path
			}
			if under(p, simDev) {
				why = append(why, where+" device node "+p+" is a simulated one")
			}
		}
		for _, m := range e.Mounts {
			if under(m.HostPath, simDev) {
				why = append(why, where+" mounts "+m.HostPath)
			}
		}
	}
	check("the spec", spec.ContainerEdits)
	for _, d := range spec.Devices {
		if _, ok := d.Annotations[SimulatedAnnotation]; ok {
			why = append(why, "device "+d.Name+" carries "+SimulatedAnnotation)
		}
		check("device "+d.Name, d.ContainerEdits)
	}
	if len(why) > 0 {
		return fmt.Errorf("CDI spec %s is simulated, not real: %s", spec.Kind, strings.Join(why, "; "))
	}
	return nil
}

func under(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || strings.HasPrefix(path, dir+"/")
}

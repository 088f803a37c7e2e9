package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GPURuntime is how containerd gives containers the GPUs that the device plugin
// allocates as CDI devices (nvidia.com/gpu=UUID, agent/cdi writes the specs).
type GPURuntime int

const (
	// GPURuntimeNone: no GPU, and none of the GPU container runtime ships (tiny).
	GPURuntimeNone GPURuntime = iota
	// GPURuntimeNativeCDI: containerd 1.7 or later resolves CDI devices itself
	// (enable_cdi); the image ships nvidia-cdi-hook, which the spec's hooks run.
	GPURuntimeNativeCDI
	// GPURuntimeNvidiaCDI: containerd 1.6 has no CDI; its default runtime is
	// nvidia-container-runtime in CDI mode, which reads the cdi.k8s.io/ annotations
	// that containerd passes through (container_annotations) and edits the OCI spec
	// before runc. The image ships it, its config and nvidia-cdi-hook.
	GPURuntimeNvidiaCDI
)

func (g GPURuntime) String() string {
	switch g {
	case GPURuntimeNativeCDI:
		return "containerd's own CDI (enable_cdi)"
	case GPURuntimeNvidiaCDI:
		return "nvidia-container-runtime in CDI mode"
	default:
		return "none (no GPU)"
	}
}

// Paths of the GPU container runtime's files in GPU images.
const (
	CDIHookPath          = "/usr/bin/nvidia-cdi-hook"
	NvidiaRuntimePath    = "/usr/bin/nvidia-container-runtime"
	NvidiaRuntimeConfig  = "/etc/nvidia-container-runtime/config.toml"
	cdiAnnotationPattern = "cdi.k8s.io/*"
)

// CDISpecDirs are where containerd and nvidia-container-runtime look for CDI specs in
// the images; agent/cdi writes to the second.
var CDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// tomlStrings renders ss as a TOML array of strings.
func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// GPURuntimeFor picks the GPU container runtime for a profile with or without a GPU,
// from the locked containerd package's Debian version (for example 1.6.20~ds1-1+deb12u3
// or 1.7.24~ds1-6+deb13u1): CDI is native from containerd 1.7 on.
func GPURuntimeFor(hasGPU bool, containerdVersion string) (GPURuntime, error) {
	if !hasGPU {
		return GPURuntimeNone, nil
	}
	v := containerdVersion
	if i := strings.IndexByte(v, ':'); i >= 0 { // epoch
		v = v[i+1:]
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return GPURuntimeNone, fmt.Errorf("containerd version %q: want major.minor (the locked containerd package's version); the GPU container runtime depends on it", containerdVersion)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return GPURuntimeNone, fmt.Errorf("containerd version %q: want major.minor (the locked containerd package's version); the GPU container runtime depends on it", containerdVersion)
	}
	if major > 1 || major == 1 && minor >= 7 {
		return GPURuntimeNativeCDI, nil
	}
	return GPURuntimeNvidiaCDI, nil
}

// gpuRuntimeFiles are the GPU container runtime's files: written ones (path in the
// tree → content) and copied binaries (path → built file).
func (n *Node) gpuRuntimeFiles() (map[string]string, map[string]string, error) {
	files, bins := map[string]string{}, map[string]string{}
	switch n.GPURuntime {
	case GPURuntimeNone:
		return files, bins, nil
	case GPURuntimeNvidiaCDI:
		if n.NvidiaRuntime == "" {
			return nil, nil, fmt.Errorf("node files: no nvidia-container-runtime binary given; containerd 1.6 images with a GPU need it (%s)", n.GPURuntime)
		}
		bins[strings.TrimPrefix(NvidiaRuntimePath, "/")] = n.NvidiaRuntime
		files[strings.TrimPrefix(NvidiaRuntimeConfig, "/")] = NvidiaRuntimeConfigFor(CDISpecDirs)
	}
	if n.CDIHook == "" {
		return nil, nil, fmt.Errorf("node files: no nvidia-cdi-hook binary given; images with a GPU need it (%s)", n.GPURuntime)
	}
	bins[strings.TrimPrefix(CDIHookPath, "/")] = n.CDIHook
	return files, bins, nil
}

// writeGPURuntime lays the GPU container runtime's files out in overlay.
func (n *Node) writeGPURuntime(overlay string) error {
	files, bins, err := n.gpuRuntimeFiles()
	if err != nil {
		return err
	}
	for name, content := range files {
		if err := writeFile(filepath.Join(overlay, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for name, src := range bins {
		if err := copyFile(src, filepath.Join(overlay, name), os.FileMode(0o755)); err != nil {
			return err
		}
	}
	return nil
}

// NvidiaRuntimeConfigFor is nvidia-container-runtime's config on containerd 1.6
// images, reading CDI specs from specDirs (CDISpecDirs in the images): CDI mode only
// (there is no libnvidia-container), devices from the cdi.k8s.io/ annotations the
// device plugin sets; NVIDIA_VISIBLE_DEVICES in an unprivileged container's image asks
// for nothing, so a CUDA image cannot take GPUs it was not allocated. Tests run the
// same config against a spec directory of their own.
func NvidiaRuntimeConfigFor(specDirs []string) string {
	return `# gpurack: nvidia-container-runtime in CDI mode (containerd 1.6 has no CDI of its
# own). The device plugin allocates GPUs as nvidia.com/gpu=UUID in cdi.k8s.io/
# annotations; gpuagent writes the CDI specs in /var/run/cdi.
accept-nvidia-visible-devices-envvar-when-unprivileged = false
accept-nvidia-visible-devices-as-volume-mounts = false

[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = ["runc"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ` + tomlStrings(specDirs) + `
`
}

// ContainerdGPU says how a containerd config reaches the GPU container runtime; the
// images use ImageContainerdGPU.
type ContainerdGPU struct {
	// SpecDirs are the CDI spec directories (containerd 1.7's own CDI).
	SpecDirs []string
	// RuntimeBinary is nvidia-container-runtime (containerd 1.6).
	RuntimeBinary string
	// SystemdCgroup: cgroups through systemd (the images) or cgroupfs.
	SystemdCgroup bool
	// RuncRoot, if set, is runc's state directory for the nvidia runtime.
	RuncRoot string
}

// ImageContainerdGPU is the images' ContainerdGPU.
var ImageContainerdGPU = ContainerdGPU{SpecDirs: CDISpecDirs, RuntimeBinary: NvidiaRuntimePath, SystemdCgroup: true}

// CRIConfig is the CRI plugin's GPU part of containerd's config for g, the lines that
// go inside [plugins."io.containerd.grpc.v1.cri"]; empty for GPURuntimeNone.
func (c ContainerdGPU) CRIConfig(g GPURuntime) string {
	switch g {
	case GPURuntimeNativeCDI:
		return `
  # GPUs: containerd resolves the device plugin's CDI devices from these specs.
  enable_cdi = true
  cdi_spec_dirs = ` + tomlStrings(c.SpecDirs) + `
`
	case GPURuntimeNvidiaCDI:
		root := ""
		if c.RuncRoot != "" {
			root = "      Root = " + strconv.Quote(c.RuncRoot) + "\n"
		}
		return `
  # GPUs: containerd 1.6 has no CDI; nvidia-container-runtime (CDI mode) is the default
  # runtime and gets the device plugin's cdi.k8s.io/ annotations.
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "nvidia"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    container_annotations = ["` + cdiAnnotationPattern + `"]

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = ` + strconv.Quote(c.RuntimeBinary) + `
      SystemdCgroup = ` + strconv.FormatBool(c.SystemdCgroup) + `
` + root
	}
	return ""
}

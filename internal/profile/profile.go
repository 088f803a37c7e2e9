// Package profile is the schema of gpurack node profiles (profiles/NAME.yaml) and of
// their lock files (profiles/NAME.lock.json, CONTRACTS §8).
//
// A profile names one node class: the Debian base, the kernel, the GPU driver and the
// hardware the node is expected to have, the Kubernetes version, extra packages, check
// thresholds, node labels and taints, and extra kernel arguments. Parsing is strict: an
// unknown field is an error, and every error names the file, the line and the field and
// says what to fix.
//
// This package parses, defaults and validates; it does no I/O beyond reading the file it
// is given. Resolving a profile against the Debian archive is imagebuilder's job.
package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"path/filepath"

	"github.com/gpurack/gpurack/internal/disksel"
	"github.com/gpurack/gpurack/internal/xidclass"
)

// Profile is one node class.
type Profile struct {
	// Name is the profile's name: lowercase letters, digits and '-', matching the file
	// name without its extension.
	Name string `yaml:"name" json:"name"`
	// Description is free text for humans.
	Description string     `yaml:"description,omitempty" json:"description,omitempty"`
	Base        Base       `yaml:"base" json:"base"`
	Kernel      Kernel     `yaml:"kernel" json:"kernel"`
	GPU         *GPU       `yaml:"gpu,omitempty" json:"gpu,omitempty"`
	Kubernetes  Kubernetes `yaml:"kubernetes" json:"kubernetes"`
	// Packages are extra Debian packages installed into the root filesystem.
	Packages []string `yaml:"packages,omitempty" json:"packages,omitempty"`
	// ExtraDebs are vendor packages that are not in Debian (NVIDIA Fabric Manager, say),
	// given as a file and its sha256.
	ExtraDebs []ExtraDeb `yaml:"extraDebs,omitempty" json:"extraDebs,omitempty"`
	// Images are container image archives (what docker save writes, or an OCI layout
	// in a tar) that the image ships and imports into containerd's k8s.io namespace at
	// boot, before kubelet starts, so that pods run them with no registry reachable.
	// Their digests enter the image id.
	Images []ImageArchive `yaml:"images,omitempty" json:"images,omitempty"`
	// Checks overrides the agent's check thresholds, keyed by check id (CONTRACTS §9).
	Checks map[string]CheckOverride `yaml:"checks,omitempty" json:"checks,omitempty"`
	Node   Node                     `yaml:"node,omitempty" json:"node"`
	Boot   Boot                     `yaml:"boot,omitempty" json:"boot"`
	// Storage says which local disks the node may use as data disks.
	Storage Storage `yaml:"storage,omitempty" json:"storage,omitzero"`
}

// Storage is the node's local storage (docs/storage.md).
type Storage struct {
	// DataDisks select the disks gpurack may prepare as data disks (a GPT partition of
	// its own, XFS with project quotas) for pods' local volumes: a disk is selected when
	// any rule matches it. None (the default): no disk is touched. gpuboot's
	// configuration may set rules per rack or machine selector instead. A disk that
	// holds anything gpurack did not make is refused whatever the rules say.
	DataDisks []disksel.RuleSpec `yaml:"dataDisks,omitempty" json:"dataDisks,omitempty"`
}

// Base is the Debian system the image is built from.
type Base struct {
	// Distro is always "debian" for now.
	Distro string `yaml:"distro" json:"distro"`
	// Suite is a Debian codename such as bookworm or trixie.
	Suite string `yaml:"suite" json:"suite"`
	// Components default to main, contrib, non-free and non-free-firmware.
	Components []string `yaml:"components,omitempty" json:"components"`
	// Mirror is the archive base URL. Empty means the host's configured Debian source,
	// resolved at lock and build time; the project never hard-codes a host name.
	Mirror string `yaml:"mirror,omitempty" json:"mirror,omitempty"`
}

// Kernel is the kernel the image boots.
type Kernel struct {
	// Package is the Debian kernel image package, e.g. linux-image-6.1.0-50-amd64.
	Package string `yaml:"package" json:"package"`
	// Version is the kernel release it installs (`uname -r`, e.g. 6.1.0-50-amd64). It is
	// required with a GPU driver, because kernel modules are built and checked against it.
	Version string `yaml:"version,omitempty" json:"version,omitempty"`
	// Modules are kernel modules the image ships beyond every node's set
	// (rootfs.NodeModules), with their dependencies: nfsd for an image that serves
	// NFS, say. Names as modprobe takes them.
	Modules []string `yaml:"modules,omitempty" json:"modules,omitempty"`
}

// GPU describes the accelerators and their driver.
type GPU struct {
	// Vendor is "nvidia".
	Vendor string `yaml:"vendor" json:"vendor"`
	// Driver is the driver the image builds and ships; left out with Simulator.
	Driver Driver `yaml:"driver,omitempty" json:"driver"`
	// Simulator makes the image a simulated GPU node, for CI and labs (decision 0662,
	// CONTRACTS §11): its agent runs the simulator model named here (gpuagent
	// --gpu-backend sim:MODEL) instead of NVML, and serves those GPUs to the image's own
	// kubelet through the device plugin. The image ships the GPU container runtime (CDI)
	// and no driver. Such a node is labelled simulated everywhere, and gpuboot makes it
	// ready only with enrollment.allowSimulated. Expect must describe the model.
	Simulator string `yaml:"simulator,omitempty" json:"simulator,omitempty"`
	Expect    Expect `yaml:"expect" json:"expect"`
	// XID is the XID policy; nil: the documented classification (internal/xidclass).
	XID *XIDPolicy `yaml:"xid,omitempty" json:"xid,omitempty"`
	// Sharing is how containers share the GPUs; nil: every container gets whole GPUs.
	Sharing *Sharing `yaml:"sharing,omitempty" json:"sharing,omitempty"`
	// Compute turns on the opt-in GPU compute check (gpu.compute, docs/compute-check.md):
	// at commissioning the agent runs PTX kernels through libcuda and judges their
	// figures; nil: off.
	Compute *Compute `yaml:"compute,omitempty" json:"compute,omitempty"`
}

// Compute is the compute check's setting: kernels through libcuda at commissioning,
// each figure judged against what a healthy GPU of the class reaches with them.
type Compute struct {
	// Enabled runs the check; a section with enabled: false keeps its figures at hand.
	Enabled bool `yaml:"enabled" json:"enabled"`
	// MinRatio is the share of an expected figure below which the check warns, in
	// (0, 1]; 0: 0.7.
	MinRatio float64 `yaml:"minRatio,omitempty" json:"minRatio,omitempty"`
	// Expect are the figures per GPU; an unset (zero) one is reported, not judged.
	Expect ComputeExpect `yaml:"expect,omitempty" json:"expect"`
}

// ComputeExpect are the figures a healthy GPU of the class reaches with gpurack's
// kernels (measured on one, not datasheet peaks: docs/compute-check.md).
type ComputeExpect struct {
	// TFLOPSFP32 is the FP32 SGEMM rate in 10¹² operations per second.
	TFLOPSFP32 float64 `yaml:"tflopsFP32,omitempty" json:"tflopsFP32,omitempty"`
	// DeviceGBps is device-memory bandwidth (bytes read + written) in 10⁹ bytes/s.
	DeviceGBps float64 `yaml:"deviceGBps,omitempty" json:"deviceGBps,omitempty"`
	// H2DGBps and D2HGBps are pinned host↔device copy rates in 10⁹ bytes/s.
	H2DGBps float64 `yaml:"h2dGBps,omitempty" json:"h2dGBps,omitempty"`
	D2HGBps float64 `yaml:"d2hGBps,omitempty" json:"d2hGBps,omitempty"`
}

// ComputeEnabled reports whether the profile turns the compute check on.
func (g *GPU) ComputeEnabled() bool { return g != nil && g.Compute != nil && g.Compute.Enabled }

// ComputeLibraryPackage is the Debian package of the driver's libcuda.so.1, which a
// profile with a driver must list in packages to enable gpu.compute.
const ComputeLibraryPackage = "libcuda1"

// ComputeMaxFigure bounds every gpu.compute.expect figure: far above any GPU (an H200's
// HBM3e is 4,800 GB/s), low enough to catch a unit slip.
const ComputeMaxFigure = 100_000

// Sharing says how containers share a node's GPUs (decision 0632). Time-slicing is the
// only way for now; the section leaves room for others (MPS) beside it.
type Sharing struct {
	TimeSlicing *TimeSlicing `yaml:"timeSlicing" json:"timeSlicing,omitempty"`
}

// TimeSlicing advertises every GPU as Replicas devices of nvidia.com/gpu, so that up to
// Replicas containers share it by the driver's time-slicing, as NVIDIA's device plugin
// does. There is no memory or fault isolation between them.
type TimeSlicing struct {
	// Replicas is the number of devices per GPU, from 2 to MaxTimeSlicingReplicas.
	Replicas int `yaml:"replicas" json:"replicas"`
}

// MaxTimeSlicingReplicas bounds gpu.sharing.timeSlicing.replicas: past it each
// container's share of a GPU is too small to be worth a device, and 64 GPUs of 64
// replicas is already 4096 devices in every ListAndWatch.
const MaxTimeSlicingReplicas = 64

// TimeSlicingReplicas is the number of devices each GPU is advertised as under g:
// gpu.sharing.timeSlicing.replicas, or 1 (no sharing) when g or the setting is absent.
func (g *GPU) TimeSlicingReplicas() int {
	if g == nil || g.Sharing == nil || g.Sharing.TimeSlicing == nil {
		return 1
	}
	return g.Sharing.TimeSlicing.Replicas
}

// XIDPolicy says what XIDs do to a GPU.
type XIDPolicy struct {
	// Withdraw lists the XIDs that withdraw their GPU from service (device plugin
	// Unhealthy, one GPU less allocatable, gpu.xid.fatal failing) until the GPU is reset
	// and the health hysteresis clears (decision 0631). Every code must be in
	// internal/xidclass's table. Left out: the codes of the reset-gpu, reboot and fatal
	// classes (xidclass.DefaultWithdraw). A lost GPU (ERROR_GPU_IS_LOST) is withdrawn
	// whatever the list says.
	Withdraw []uint32 `yaml:"withdraw" json:"withdraw"`
}

// WithdrawXIDs is the XIDs that withdraw a GPU under g: gpu.xid.withdraw, or the
// default classification when g or the setting is absent.
func (g *GPU) WithdrawXIDs() []uint32 {
	if g == nil || g.XID == nil {
		return xidclass.DefaultWithdraw()
	}
	return g.XID.Withdraw
}

// Driver is the GPU driver release and kernel-module flavor.
type Driver struct {
	// Version is the full driver version, e.g. 535.261.03.
	Version string `yaml:"version" json:"version"`
	// Flavor is "open" (open GPU kernel modules) or "proprietary".
	Flavor string `yaml:"flavor" json:"flavor"`
}

// Expect is the hardware a node of this class must have; the agent's checks compare
// what NVML reports against it.
type Expect struct {
	Count int `yaml:"count" json:"count"`
	// Product is NVML's product name, e.g. "NVIDIA H100 80GB HBM3".
	Product string `yaml:"product" json:"product"`
	// MemoryMiB is the total framebuffer per GPU in MiB as NVML reports it.
	MemoryMiB   int  `yaml:"memoryMiB" json:"memoryMiB"`
	PCIe        PCIe `yaml:"pcie" json:"pcie"`
	NVLinkLinks int  `yaml:"nvlinkLinks,omitempty" json:"nvlinkLinks"`
}

// PCIe is the expected link of every GPU at full speed.
type PCIe struct {
	Gen   int `yaml:"gen" json:"gen"`
	Width int `yaml:"width" json:"width"`
}

// Kubernetes is what the node runs to join the cluster.
type Kubernetes struct {
	// Version is the kubelet version, e.g. v1.34.2.
	Version string `yaml:"version" json:"version"`
	// ContainerRuntime is "containerd".
	ContainerRuntime string `yaml:"containerRuntime,omitempty" json:"containerRuntime"`
	// PodNetwork is how the node's pod network reaches other nodes; nil: the
	// defaults (PodNetworkSettings).
	PodNetwork *PodNetwork `yaml:"podNetwork,omitempty" json:"podNetwork,omitempty"`
}

// PodNetwork settings (agent/podnet, decision 0601).
type PodNetwork struct {
	// Backend is flannel's backend: "vxlan" (the default; works across L3) or
	// "host-gw" (plain routes; every node on one L2 segment).
	Backend string `yaml:"backend,omitempty" json:"backend,omitempty"`
	// PodSubnet is the cluster's networking.podSubnet (flannel's Network, outside
	// which pod traffic is masqueraded); default 10.244.0.0/16, controlplane-bootstrap's
	// default. The agent refuses a node whose podCIDR lies outside it.
	PodSubnet string `yaml:"podSubnet,omitempty" json:"podSubnet,omitempty"`
}

// ValidPodNetworkBackend reports whether b names a pod network backend gpurack runs
// (flannel's vxlan or host-gw), or is empty (the default).
func ValidPodNetworkBackend(b string) bool { return b == "" || b == "vxlan" || b == "host-gw" }

// ValidPodSubnet reports whether s is a network in CIDR form (no host bits set), as a
// cluster's networking.podSubnet is.
func ValidPodSubnet(s string) bool {
	p, err := netip.ParsePrefix(s)
	return err == nil && p == p.Masked()
}

// Pod network defaults.
const (
	DefaultPodNetworkBackend = "vxlan"
	DefaultPodSubnet         = "10.244.0.0/16"
)

// PodNetworkSettings are the profile's pod network settings with the defaults filled
// in (kept out of Canonical, so profiles without the section keep their digest).
func (k Kubernetes) PodNetworkSettings() PodNetwork {
	var pn PodNetwork
	if k.PodNetwork != nil {
		pn = *k.PodNetwork
	}
	if pn.Backend == "" {
		pn.Backend = DefaultPodNetworkBackend
	}
	if pn.PodSubnet == "" {
		pn.PodSubnet = DefaultPodSubnet
	}
	return pn
}

// ExtraDeb is a vendor .deb that is not in the Debian archive.
type ExtraDeb struct {
	// File is a path relative to the profile's folder.
	File   string `yaml:"file" json:"file"`
	SHA256 string `yaml:"sha256" json:"sha256"`
}

// ImageArchive is one container image archive to ship in the image.
type ImageArchive struct {
	// Path is the archive file, relative to the profile's folder (or absolute).
	Path string `yaml:"path" json:"path"`
	// Name, when set, is an image reference the archive must carry (a docker RepoTag
	// or the OCI index's io.containerd.image.name); the build fails otherwise. It is
	// the name pods use, so checking it catches a re-tagged export early.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
}

// ArchivePath is where an image archive listed in the profile at profilePath lives:
// a relative path is taken from the profile's folder.
func ArchivePath(profilePath, archive string) string {
	if filepath.IsAbs(archive) {
		return archive
	}
	return filepath.Join(filepath.Dir(profilePath), archive)
}

// CheckOverride changes one check's thresholds. The meaning of Warn and Fail depends
// on the check (a count, a rate, degrees below the slowdown threshold); the agent's
// check documents its unit.
type CheckOverride struct {
	Disabled bool     `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	Warn     *float64 `yaml:"warn,omitempty" json:"warn,omitempty"`
	Fail     *float64 `yaml:"fail,omitempty" json:"fail,omitempty"`
}

// Node is what the node carries in Kubernetes beyond gpurack's own labels.
type Node struct {
	Labels map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Taints []Taint           `yaml:"taints,omitempty" json:"taints,omitempty"`
}

// Taint is a Kubernetes node taint registered by kubelet.
type Taint struct {
	Key    string `yaml:"key" json:"key"`
	Value  string `yaml:"value,omitempty" json:"value,omitempty"`
	Effect string `yaml:"effect" json:"effect"`
}

// Boot holds extra kernel arguments for the image's command line.
type Boot struct {
	KernelArgs []string `yaml:"kernelArgs,omitempty" json:"kernelArgs,omitempty"`
}

// DefaultComponents are the archive areas used when a profile names none.
var DefaultComponents = []string{"main", "contrib", "non-free", "non-free-firmware"}

// applyDefaults fills the fields a profile may leave out.
func (p *Profile) applyDefaults() {
	if len(p.Base.Components) == 0 {
		p.Base.Components = append([]string(nil), DefaultComponents...)
	}
	if p.Kubernetes.ContainerRuntime == "" {
		p.Kubernetes.ContainerRuntime = "containerd"
	}
}

// Canonical returns the profile as canonical JSON: defaults applied, fields in schema
// order, maps sorted. It is what the image ships as /etc/gpurack/profile.json and what
// the profile digest is computed over, so formatting or comments in the YAML do not
// change an image.
func (p *Profile) Canonical() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		// Only plain data types are reachable from Profile; Marshal cannot fail.
		panic("profile: canonical JSON: " + err.Error())
	}
	return b
}

// Digest is "sha256:" plus the hex sha256 of Canonical.
func (p *Profile) Digest() string {
	sum := sha256.Sum256(p.Canonical())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// HasGPU reports whether the profile declares accelerators, real or simulated: the
// image then ships the GPU container runtime and the agent serves the device plugin.
func (p *Profile) HasGPU() bool { return p.GPU != nil }

// HasDriver reports whether the image builds and ships a GPU driver: a gpu section that
// is not a simulator's.
func (p *Profile) HasDriver() bool { return p.GPU != nil && p.GPU.Simulator == "" }

// Simulated reports whether the profile's GPUs are the simulator's (gpu.simulator).
func (p *Profile) Simulated() bool { return p.GPU != nil && p.GPU.Simulator != "" }

// SimulatorModels are the models gpu.simulator may name: the agent's simulator models
// (agent/gpu/sim, whose tests keep the two lists equal).
var SimulatorModels = []string{"dgxa100", "dgxh100", "dgxh200", "h100nvl"}

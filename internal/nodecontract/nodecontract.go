// Package nodecontract names, once, what gpurack writes on a Kubernetes Node (CONTRACTS
// §5): the taints gpuboot's node controller sets and removes, the GPUHealthy condition
// the agent owns, the gpurack.io/* labels and GPU feature discovery's sharing labels
// the agent sets, and the GPU resource it advertises. The agent (agent/kubejoin),
// gpuboot's node controller (pxe/nodecontrol) and the profile validation use these
// constants; tests keep the literal strings, so a renamed constant value fails them.
//
// It holds names only: who writes what, and when, is in the packages that do it.
package nodecontract

// Taints.
const (
	// TaintUnvalidated is registered with the Node (kubelet's registerWithTaints, or
	// the agent's simulated kubelet); gpuboot removes it when the machine is ready.
	TaintUnvalidated = "gpurack.io/unvalidated"
	// TaintGPUUnhealthy is set by gpuboot while the Node's GPUHealthy condition is
	// False and removed when it is True.
	TaintGPUUnhealthy = "gpurack.io/gpu-unhealthy"
	// TaintRollout (NoSchedule) is set by a gpuboot rollout on the Node it drains and
	// removed once the machine is ready on the new image (decision 0687).
	TaintRollout = "gpurack.io/rollout"
)

// ConditionGPUHealthy is the Node condition type the agent writes: True when the
// node's GPUs are fit for work, False when a check fails, Unknown before the first
// checklist. An untyped constant, so it is a corev1.NodeConditionType where one is
// expected.
const ConditionGPUHealthy = "GPUHealthy"

// Labels the agent owns (NodeRestriction lets a node set them on itself). Profiles may
// not set labels under LabelPrefix.
const (
	LabelPrefix        = "gpurack.io/"
	LabelImage         = LabelPrefix + "image"
	LabelDriverVersion = LabelPrefix + "driver-version"
	LabelGPUProduct    = LabelPrefix + "gpu.product"
	LabelGPUCount      = LabelPrefix + "gpu.count"
	// LabelSimulated is "true" on a Node whose GPUs are the simulator's.
	LabelSimulated = LabelPrefix + "simulated"
	// LabelAgent is "true" on every Node that gpuagent runs (real or simulated): the
	// node label of the job queues' flavor (decision 0702), which Kueue adds to queued
	// pods' node selectors.
	LabelAgent = LabelPrefix + "agent"
)

// GPU sharing labels, under GPU feature discovery's names so that workloads written
// for NVIDIA's plugin select nodes the same way. The agent sets both on a node with
// GPUs (decision 0632).
const (
	// LabelGPUReplicas is the devices each GPU is advertised as: 1 without sharing.
	LabelGPUReplicas = "nvidia.com/gpu.replicas"
	// LabelGPUSharingStrategy is SharingTimeSlicing or SharingNone.
	LabelGPUSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	SharingTimeSlicing      = "time-slicing"
	SharingNone             = "none"
)

// ResourceGPU is the extended resource a GPU node advertises (NVIDIA's device-plugin
// name, CONTRACTS §11).
const ResourceGPU = "nvidia.com/gpu"

// Package localvol names, once, what gpurack's node-local volumes (the gpurack-local
// StorageClass, docs/storage.md, decision 0676) put in the cluster: the provisioner and
// CSIDriver name, the StorageClass, the namespace the per-node capacity objects live
// in, the labels and the one StorageClass parameter. controlplane-bootstrap creates the
// StorageClass, CSIDriver, RBAC and admission policy under these names
// (controlplane-bootstrap/localvolumes); each node's agent provisions its own volumes
// and publishes its own capacity under them (agent/localpv).
//
// It holds names only.
package localvol

const (
	// Provisioner is the StorageClass provisioner, the value of a volume's
	// pv.kubernetes.io/provisioned-by, and the name of the CSIDriver object whose
	// storageCapacity: true makes the scheduler read the capacity objects. No CSI driver
	// runs under it: the volumes are `local` PersistentVolumes.
	Provisioner = "local.gpurack.io"
	// StorageClass is the class controlplane-bootstrap creates (WaitForFirstConsumer,
	// reclaim Delete). Operators may add others with the same provisioner (Retain).
	StorageClass = "gpurack-local"
	// Namespace holds the CSIStorageCapacity objects, one per node and StorageClass.
	Namespace = "gpurack-storage"
	// LabelNode is on every PersistentVolume and CSIStorageCapacity a node's agent
	// writes, naming that node; the admission policy holds a node to its own.
	LabelNode = "gpurack.io/local-volume-node"
	// TopologyKey is the Node label the volumes' node affinity and the capacity
	// objects' topology use: the node's own hostname label (the agent sets the
	// hostname to the node name).
	TopologyKey = "kubernetes.io/hostname"
	// ParamDirectoryMode is the one StorageClass parameter: the octal permission bits
	// of a new volume's directory ("0777" when absent, so a pod running as any user
	// can write; "0750" and a pod fsGroup for stricter). Any other parameter makes
	// provisioning fail with an event naming it.
	ParamDirectoryMode = "directoryMode"
	// MountRoot is where the agent mounts data disks; a volume's directory is
	// MountRoot/<partition GUID>/volumes/<PV name>. The admission policy refuses a
	// PV of this provisioner whose path lies elsewhere.
	MountRoot = "/var/lib/gpurack/datadisks"
	// VolumesDir is the directory on each data disk that holds the volumes.
	VolumesDir = "volumes"
)

// Annotations Kubernetes defines, which the provisioner and the admission policy read.
const (
	// AnnSelectedNode is set on a WaitForFirstConsumer claim by the scheduler.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnProvisionedBy is set on a dynamically provisioned PersistentVolume.
	AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"
)

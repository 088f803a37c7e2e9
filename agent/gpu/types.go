package gpu

import "github.com/gpurack/gpurack/agent/gpu/snapshot"

// The snapshot types live in the leaf package agent/gpu/snapshot, which does not
// import go-nvml; these aliases keep the adapter's signatures (Read returns a
// Snapshot) and the callers that already import this package unchanged. Packages that
// only need the data (agent/checks) import agent/gpu/snapshot instead.
type (
	Snapshot     = snapshot.Snapshot
	Driver       = snapshot.Driver
	GPU          = snapshot.GPU
	Value[T any] = snapshot.Value[T]
	ECCMode      = snapshot.ECCMode
	RowRemap     = snapshot.RowRemap
	RetiredPages = snapshot.RetiredPages
	PCIe         = snapshot.PCIe
	NVLink       = snapshot.NVLink
	Fabric       = snapshot.Fabric
	Process      = snapshot.Process
)

// Known returns a valid Value.
func Known[T any](v T) Value[T] { return snapshot.Known(v) }

// Package xidclass is NVIDIA's XID errors as gpurack classifies them: one table, with
// its sources, that the agent's XID engine (agent/xid) and profile validation
// (gpu.xid.withdraw, internal/profile) both read, and the default list of XIDs that
// withdraw a GPU from service (decision 0631).
//
// It holds data and lookups only: reading XIDs is agent/xid's, judging them
// agent/checks'.
package xidclass

import (
	"fmt"
	"slices"
)

// Class is what an XID asks of an operator.
type Class string

// The classes, from harmless to worst.
const (
	// Application: caused by a user program (bad memory access, engine exception); the
	// driver recovered and the GPU is fine. Ignored for health.
	Application Class = "application"
	// Recoverable: the driver recovered, but hardware misbehaved; counts toward
	// gpu.xid.recent (warn).
	Recoverable Class = "recoverable"
	// ResetGPU: the GPU must be reset before it is trusted again.
	ResetGPU Class = "reset-gpu"
	// Reboot: the node must be rebooted (the GPU is unreachable).
	Reboot Class = "reboot"
	// Fatal: the hardware is damaged; replace the GPU.
	Fatal Class = "fatal"
)

// Counts reports whether an XID of the class counts toward gpu.xid.fatal, and so
// withdraws its GPU, when the profile sets no gpu.xid.withdraw (DefaultWithdraw).
func (c Class) Counts() bool { return c == ResetGPU || c == Reboot || c == Fatal }

// Classification is one row of the table: what an XID code is and what gpurack does
// about it.
type Classification struct {
	Code  uint32
	Name  string
	Class Class
	// Why cites the sources behind the class, where they disagree too.
	Why string
}

// Sources, abbreviated in Classification.Why:
//
//	catalog  NVIDIA Xid catalog, "Immediate Action" column
//	DP       NVIDIA k8s-device-plugin internal/rm/health.go (ignored XIDs)
//	DCGM     DCGM 4.6 BuildXidMappings (always-watched XIDs, FAIL or WARN)
//	gcm      facebookresearch/gcm NON_CRITICAL_ERRORS
//	aznhc    Azure/azurehpc-health-checks XID_EC list
//	EKS      aws/eks-node-monitoring-agent WellKnownXidCodes
var table = map[uint32]Classification{
	13:  {13, "Graphics Engine Exception", Application, "catalog RESTART_APP; DP ignores; gcm non-critical"},
	31:  {31, "GPU memory page fault", Application, "catalog RESTART_APP; DP ignores; gcm non-critical; DCGM warns"},
	43:  {43, "GPU stopped processing", Application, "catalog IGNORE; DP ignores; gcm non-critical; DCGM warns"},
	45:  {45, "Preemptive cleanup, due to previous errors", Application, "catalog IGNORE; DP ignores; gcm non-critical"},
	68:  {68, "NVDEC0 exception", Application, "DP ignores; gcm non-critical (aznhc fails it)"},
	48:  {48, "DBE (double bit error) ECC error", ResetGPU, "DCGM FAIL; gcm, aznhc, EKS critical; catalog WORKFLOW_XID_48 (reset, then check remapping)"},
	62:  {62, "Internal micro-controller halt", ResetGPU, "aznhc, EKS critical; DCGM thermal watch"},
	63:  {63, "ECC page retirement or row remapping recording event", Recoverable, "catalog IGNORE; gcm non-critical (DP, aznhc fail it); DCGM warns"},
	64:  {64, "ECC page retirement or row remapper recording failure", Fatal, "catalog RESET_GPU; DCGM FAIL; gcm, aznhc, EKS critical; a failed remap needs an RMA"},
	74:  {74, "NVLink error", ResetGPU, "catalog WORKFLOW_NVLINK_ERR; DCGM FAIL; gcm, aznhc, EKS critical"},
	79:  {79, "GPU has fallen off the bus", Reboot, "catalog RESTART_BM; DCGM FAIL; every tool critical"},
	92:  {92, "High single-bit ECC error rate", Recoverable, "catalog IGNORE; gcm non-critical (DP, aznhc fail it)"},
	94:  {94, "Contained ECC error", Recoverable, "catalog RESTART_APP; DCGM WARN; only the affected application is killed"},
	95:  {95, "Uncontained ECC error", ResetGPU, "catalog RESET_GPU; DCGM FAIL; EKS critical"},
	109: {109, "Context switch timeout", Recoverable, "catalog RESET_GPU, but DP and gcm ignore it as application-caused; EKS critical; warn as a compromise"},
	119: {119, "GSP RPC timeout", ResetGPU, "catalog RESET_GPU; DCGM FAIL; aznhc, EKS critical"},
	120: {120, "GSP error", ResetGPU, "catalog RESET_GPU; DCGM FAIL; aznhc, EKS critical"},
	140: {140, "Unrecovered ECC error", ResetGPU, "catalog RESET_GPU; DCGM FAIL; EKS critical"},
	154: {154, "GPU recovery action changed", Recoverable, "informational; gpu.recovery-action reads the field itself"},
}

// Classify returns the table's row for code. Codes the table does not know are
// Recoverable: the device plugin and gcm would mark them unhealthy, aznhc would ignore
// them; a warning makes them visible without draining nodes on an unknown code.
func Classify(code uint32) (Classification, bool) {
	if i, ok := table[code]; ok {
		return i, true
	}
	return Classification{Code: code, Name: fmt.Sprintf("XID %d", code), Class: Recoverable, Why: "not in the table; warn"}, false
}

// ClassOf is the class of code (Recoverable for codes the table does not know).
func ClassOf(code uint32) Class {
	c, _ := Classify(code)
	return c.Class
}

// Table returns the table's rows ordered by code.
func Table() []Classification {
	out := make([]Classification, 0, len(table))
	for code := uint32(0); code < 1000; code++ {
		if i, ok := table[code]; ok {
			out = append(out, i)
		}
	}
	return out
}

// Known reports whether code is in the table.
func Known(code uint32) bool {
	_, ok := table[code]
	return ok
}

// DefaultWithdraw is the XIDs that withdraw a GPU when a profile sets no
// gpu.xid.withdraw: every code of a class that counts (reset-gpu, reboot, fatal),
// ordered by code.
func DefaultWithdraw() []uint32 {
	var out []uint32
	for _, c := range Table() {
		if c.Class.Counts() {
			out = append(out, c.Code)
		}
	}
	return out
}

// Withdraws returns whether an XID withdraws its GPU under list (nil: DefaultWithdraw).
func Withdraws(list []uint32) func(code uint32) bool {
	if list == nil {
		list = DefaultWithdraw()
	}
	set := slices.Clone(list)
	return func(code uint32) bool { return slices.Contains(set, code) }
}

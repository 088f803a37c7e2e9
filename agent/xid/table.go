// Package xid knows NVIDIA XID errors: which ones matter (the classification table of
// internal/xidclass, with its sources), how to read them from the kernel log (/dev/kmsg
// "NVRM: Xid" lines) and from NVML event sets, and what the agent has seen since boot
// (Tracker).
//
// It does not decide node health; agent/checks turns the tracked XIDs into results
// (gpu.xid.fatal, gpu.xid.recent) and agent/health into a HealthSummary.
package xid

import "github.com/gpurack/gpurack/internal/xidclass"

// The classification table lives in internal/xidclass, which profile validation reads
// too; these names keep the agent's code reading xid.Class, xid.Classify.

// Class is what an XID asks of an operator (xidclass.Class).
type Class = xidclass.Class

// Classification is one row of the table (xidclass.Classification).
type Classification = xidclass.Classification

// The classes, from harmless to worst.
const (
	Application = xidclass.Application
	Recoverable = xidclass.Recoverable
	ResetGPU    = xidclass.ResetGPU
	Reboot      = xidclass.Reboot
	Fatal       = xidclass.Fatal
)

// Classify returns the table's row for code (xidclass.Classify).
func Classify(code uint32) (Classification, bool) { return xidclass.Classify(code) }

// ClassOf is the class of code (Recoverable for codes the table does not know).
func ClassOf(code uint32) Class { return xidclass.ClassOf(code) }

// Table returns the table's rows ordered by code.
func Table() []Classification { return xidclass.Table() }

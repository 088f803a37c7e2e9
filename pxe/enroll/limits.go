package enroll

import (
	"encoding/base64"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// Bounds on what an agent may send. Register is unauthenticated (anyone who reaches the
// TLS port may call it), and what it carries is stored in the inventory while the
// machine waits for approval, so its size is bounded here rather than by what a real
// machine happens to send. Real facts of an 8-GPU server with 16 NICs are about 5 kB
// and a full commissioning checklist about 20 kB: the bounds leave ten times that.
// gpuboot's gRPC server also refuses any message over MaxMessageBytes before it is
// decoded.
const (
	// MaxFactsBytes bounds MachineFacts (encoded) in Register.
	MaxFactsBytes = 64 << 10
	// MaxFactsGPUs, MaxFactsNICs and MaxFactsIPs bound the repeated fields of
	// MachineFacts.
	MaxFactsGPUs = 64
	MaxFactsNICs = 256
	MaxFactsIPs  = 256
	// MaxChecklistBytes bounds a Checklist (encoded), in Register and in
	// ReportCommissioning.
	MaxChecklistBytes = 256 << 10
	// MaxChecklistResults bounds Checklist.results.
	MaxChecklistResults = 1024
	// MaxHealthBytes bounds the HealthSummary (encoded) of a Heartbeat.
	MaxHealthBytes = 16 << 10
	// MaxAllocationBytes and MaxAllocationHolders bound the GPUAllocation of a
	// Heartbeat: 64 GPUs shared 64 ways by pods with the longest names fit.
	MaxAllocationBytes   = 128 << 10
	MaxAllocationHolders = 4096
	// MaxDataDisksBytes and MaxDataDisks bound the DataDisks of a Heartbeat: a
	// machine's every whole disk, with its detail; a 24-bay server takes about 5 kB.
	MaxDataDisksBytes = 64 << 10
	MaxDataDisks      = 256
	// MaxWipeErrorBytes bounds the error of a Heartbeat's wipe_result: it goes into the
	// machine's history as the reason of "wipe-data-disk refused".
	MaxWipeErrorBytes = 4 << 10
	// MaxMessageBytes is the largest gRPC message gpuboot's server decodes: above
	// MaxFactsBytes + MaxChecklistBytes plus signatures, far below gRPC's default 4 MiB.
	MaxMessageBytes = 512 << 10
)

// limitError is the ResourceExhausted error for a bound; it names the field, the size
// sent and the bound, so that an agent's log says what to send less of.
func limitError(call, what string, got, limit int, name string) error {
	return status.Errorf(codes.ResourceExhausted, "%s: %s is %d, above the limit of %d (enroll.%s): send less", call, what, got, limit, name)
}

// checkRegisterLimits bounds the facts and checklist of a Register call.
func checkRegisterLimits(req *bootv1.RegisterRequest) error {
	if f := req.GetFacts(); f != nil {
		if n := proto.Size(f); n > MaxFactsBytes {
			return limitError("register", "facts (bytes)", n, MaxFactsBytes, "MaxFactsBytes")
		}
		if n := len(f.GetGpus()); n > MaxFactsGPUs {
			return limitError("register", "facts.gpus (count)", n, MaxFactsGPUs, "MaxFactsGPUs")
		}
		if n := len(f.GetNics()); n > MaxFactsNICs {
			return limitError("register", "facts.nics (count)", n, MaxFactsNICs, "MaxFactsNICs")
		}
		if n := len(f.GetIps()); n > MaxFactsIPs {
			return limitError("register", "facts.ips (count)", n, MaxFactsIPs, "MaxFactsIPs")
		}
	}
	if cl := req.GetChecklist(); cl != nil {
		return checkChecklistLimits("register", cl)
	}
	return nil
}

// checkReportLimits bounds the checklist of a ReportCommissioning call.
func checkReportLimits(req *bootv1.ReportCommissioningRequest) error {
	if cl := req.GetReport(); cl != nil {
		return checkChecklistLimits("report commissioning", cl)
	}
	return nil
}

func checkChecklistLimits(call string, cl *machinev1.Checklist) error {
	if n := proto.Size(cl); n > MaxChecklistBytes {
		return limitError(call, "checklist (bytes)", n, MaxChecklistBytes, "MaxChecklistBytes")
	}
	if n := len(cl.GetResults()); n > MaxChecklistResults {
		return limitError(call, "checklist.results (count)", n, MaxChecklistResults, "MaxChecklistResults")
	}
	return nil
}

// checkHeartbeatLimits bounds the health summary, the GPU allocation, the data disks and
// the wipe result of a Heartbeat.
func checkHeartbeatLimits(req *bootv1.HeartbeatRequest) error {
	if n := proto.Size(req.GetHealth()); n > MaxHealthBytes {
		return limitError("heartbeat", "health (bytes)", n, MaxHealthBytes, "MaxHealthBytes")
	}
	if n := proto.Size(req.GetGpuAllocation()); n > MaxAllocationBytes {
		return limitError("heartbeat", "gpu_allocation (bytes)", n, MaxAllocationBytes, "MaxAllocationBytes")
	}
	if n := len(req.GetGpuAllocation().GetHolders()); n > MaxAllocationHolders {
		return limitError("heartbeat", "gpu_allocation.holders (count)", n, MaxAllocationHolders, "MaxAllocationHolders")
	}
	if n := proto.Size(req.GetDataDisks()); n > MaxDataDisksBytes {
		return limitError("heartbeat", "data_disks (bytes)", n, MaxDataDisksBytes, "MaxDataDisksBytes")
	}
	if n := len(req.GetDataDisks().GetDisks()); n > MaxDataDisks {
		return limitError("heartbeat", "data_disks.disks (count)", n, MaxDataDisks, "MaxDataDisks")
	}
	if n := len(req.GetWipeResult().GetError()); n > MaxWipeErrorBytes {
		return limitError("heartbeat", "wipe_result.error (bytes)", n, MaxWipeErrorBytes, "MaxWipeErrorBytes")
	}
	return nil
}

// recordBytes is about what m takes in the inventory (JSON, byte fields in base64):
// what agents send (facts, checklists, health, GPU allocation, data disks, EK
// certificates, keys)
// and an allowance for the fixed fields. It counts against Config.MaxUnapprovedBytes,
// since anyone may make and fill unapproved records: the largest facts, checklist,
// health summary and allocation one identity may hold come to about 600 kB.
func recordBytes(m *inventory.Machine) int64 {
	b64 := base64.StdEncoding.EncodedLen
	n := 1024 + b64(len(m.Facts)) + b64(len(m.Checklist)) + b64(len(m.CommissioningReport)) +
		b64(len(m.Health)) + b64(len(m.GPUAllocation)) + b64(len(m.DataDisks)) + b64(len(m.EKCertificate))
	for _, k := range m.Keys {
		n += 256 + b64(len(k.PublicKey)) + b64(len(k.EKCertificate)) + len(k.Fingerprint) + len(k.BootID) + len(k.Remote) + len(k.EKHash)
	}
	return int64(n)
}

// bytesLimitError refuses a new or larger unapproved record once they hold limit
// bytes; it wraps ErrLimited and is ResourceExhausted over gRPC.
func bytesLimitError(held, limit int64) error {
	return limitedError{fmt.Errorf("%w: unapproved machines hold %d bytes, the limit is %d (enrollment.maxUnapprovedBytes): approve or reject waiting machines", ErrLimited, held, limit)}
}

// limitedError is an ErrLimited refusal that answers as ResourceExhausted wherever a
// handler passes a gRPC status through.
type limitedError struct{ err error }

func (e limitedError) Error() string { return e.err.Error() }
func (e limitedError) Unwrap() error { return e.err }
func (e limitedError) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, e.err.Error())
}

// Package protoconv converts the agent's plain types (check results, health
// summaries, snapshots, XID events) into the protobuf messages of api/agent/v1 and
// api/machine/v1. It holds no logic beyond the mapping.
package protoconv

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/xid"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// Status maps a check status.
func Status(s checks.Status) machinev1.CheckStatus {
	switch s {
	case checks.Pass:
		return machinev1.CheckStatus_CHECK_STATUS_PASS
	case checks.Warn:
		return machinev1.CheckStatus_CHECK_STATUS_WARN
	case checks.Fail:
		return machinev1.CheckStatus_CHECK_STATUS_FAIL
	case checks.NotApplicable:
		return machinev1.CheckStatus_CHECK_STATUS_NOT_APPLICABLE
	}
	return machinev1.CheckStatus_CHECK_STATUS_UNKNOWN
}

// Result maps one result; at is when its inputs were read.
func Result(r checks.Result, at *timestamppb.Timestamp) *machinev1.CheckResult {
	out := &machinev1.CheckResult{Id: string(r.ID), Status: Status(r.Status), GpuUuid: r.GPUUUID,
		Observed: r.Observed, Expected: r.Expected, Remedy: r.Remedy, Message: r.Message, ObservedAt: at}
	if r.GPU >= 0 {
		i := int32(r.GPU)
		out.GpuIndex = &i
	}
	return out
}

// Phase maps a checklist phase.
func Phase(p monitor.Phase) machinev1.CheckPhase {
	switch p {
	case monitor.PhasePreApproval:
		return machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL
	case monitor.PhaseCommissioning:
		return machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING
	}
	return machinev1.CheckPhase_CHECK_PHASE_CONTINUOUS
}

// Identity maps the machine identity.
func Identity(id facts.Identity) *machinev1.MachineIdentity {
	return &machinev1.MachineIdentity{BootMac: id.BootMAC, SmbiosUuid: id.SMBIOSUUID, Serial: id.Serial}
}

// Checklist maps a completed checklist.
func Checklist(c *monitor.Checklist, id facts.Identity, imageID, nodeName string) *machinev1.Checklist {
	if c == nil {
		return nil
	}
	at := timestamppb.New(c.Snapshot.TakenAt)
	out := &machinev1.Checklist{Identity: Identity(id), ImageId: imageID, Phase: Phase(c.Phase),
		StartedAt: timestamppb.New(c.StartedAt), FinishedAt: timestamppb.New(c.FinishedAt),
		Overall: Status(c.Overall), NodeName: nodeName, DriverVersion: c.Snapshot.Driver.Version, Profile: c.Profile,
		Simulated: c.Simulated}
	for _, r := range c.Results {
		out.Results = append(out.Results, Result(r, at))
	}
	return out
}

// HealthState maps a health state.
func HealthState(s health.State) machinev1.HealthState {
	switch s {
	case health.Healthy:
		return machinev1.HealthState_HEALTH_STATE_HEALTHY
	case health.Degraded:
		return machinev1.HealthState_HEALTH_STATE_DEGRADED
	case health.Unhealthy:
		return machinev1.HealthState_HEALTH_STATE_UNHEALTHY
	}
	return machinev1.HealthState_HEALTH_STATE_UNKNOWN
}

// Health maps a health summary.
func Health(s health.Summary) *machinev1.HealthSummary {
	out := &machinev1.HealthSummary{State: HealthState(s.State), FailingCheckIds: s.Failing, WarningCheckIds: s.Warning,
		HealthyGpuCount: uint32(s.HealthyGPUs), GpuCount: uint32(s.GPUCount), GpuHealthy: s.GPUHealthy,
		GpuHealthyReason: s.Reason, GpuHealthyMessage: s.Message, UpdatedAt: timestamppb.New(s.UpdatedAt)}
	for _, g := range s.UnhealthyGPUs {
		out.UnhealthyGpuIndexes = append(out.UnhealthyGpuIndexes, int32(g))
	}
	return out
}

// GPU maps a GPU's static description.
func GPU(g *gpu.GPU) *machinev1.GPU {
	out := &machinev1.GPU{Index: int32(g.Index), Uuid: g.UUID, ProductName: g.Name.V, PciBusId: g.PCIBusID,
		MemoryMib: g.MemoryTotalMiB.V, VbiosVersion: g.VBIOS.V, InforomVersion: g.InfoROMImage.V,
		PcieMaxGen: uint32(g.PCIe.MaxGen.V), PcieMaxWidth: uint32(g.PCIe.MaxWidth.V),
		PcieCurrentGen: uint32(g.PCIe.CurGen.V), PcieCurrentWidth: uint32(g.PCIe.CurWidth.V),
		Serial: g.Serial, ComputeCapability: g.ComputeCapability}
	for _, l := range g.NVLinks.V {
		out.NvlinkLinksTotal++
		if l.Active {
			out.NvlinkLinksActive++
		}
	}
	return out
}

// XID maps an XID event.
func XID(e xid.Event) *agentv1.XIDEvent {
	out := &agentv1.XIDEvent{PciBusId: e.PCIBusID, Xid: e.Code, Class: string(e.Class), Fatal: e.Class.Counts(),
		Message: e.Message, Pid: e.PID, ProcessName: e.Process, Simulated: e.Simulated}
	if e.GPU >= 0 {
		i := int32(e.GPU)
		out.GpuIndex = &i
	}
	return out
}

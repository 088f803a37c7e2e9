package server

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/gossip"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/protoconv"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// RackMember is a gossip member as the API shows it. self is this agent's own health,
// which is fresher than the metadata it last announced.
func RackMember(m gossip.Member, self health.Summary) *agentv1.RackMember {
	var h *machinev1.HealthSummary
	if m.Self {
		h = protoconv.Health(self)
	} else {
		st := health.State(m.Meta.State)
		h = &machinev1.HealthSummary{State: protoconv.HealthState(st), FailingCheckIds: m.Meta.Failing,
			GpuCount: uint32(m.Meta.GPUs), HealthyGpuCount: uint32(m.Meta.HealthyGPUs), GpuHealthy: st != health.Unhealthy}
	}
	return &agentv1.RackMember{NodeName: m.Name, Address: m.Address, State: memberState(m.State), Health: h,
		ImageId: m.Meta.ImageID, DriverVersion: m.Meta.Driver, Self: m.Self, Observer: m.Meta.Observer, UpdatedAt: timestamppb.New(m.UpdatedAt)}
}

func memberState(s gossip.MemberState) agentv1.MemberState {
	switch s {
	case gossip.Alive:
		return agentv1.MemberState_MEMBER_STATE_ALIVE
	case gossip.Suspect:
		return agentv1.MemberState_MEMBER_STATE_SUSPECT
	case gossip.Dead:
		return agentv1.MemberState_MEMBER_STATE_DEAD
	case gossip.Left:
		return agentv1.MemberState_MEMBER_STATE_LEFT
	}
	return agentv1.MemberState_MEMBER_STATE_UNSPECIFIED
}

var memberChanges = map[gossip.Change]agentv1.MemberChange{
	gossip.Joined:         agentv1.MemberChange_MEMBER_CHANGE_JOINED,
	gossip.Updated:        agentv1.MemberChange_MEMBER_CHANGE_UPDATED,
	gossip.LeftGracefully: agentv1.MemberChange_MEMBER_CHANGE_LEFT,
	gossip.Failed:         agentv1.MemberChange_MEMBER_CHANGE_FAILED,
}

// memberChanged is the API event of a rack member change.
func memberChanged(c *monitor.MemberChange, self health.Summary) *agentv1.Event {
	return &agentv1.Event{Payload: &agentv1.Event_MemberChanged{MemberChanged: &agentv1.GossipMemberChanged{
		Change: memberChanges[c.Change], Member: RackMember(c.Member, self)}}}
}

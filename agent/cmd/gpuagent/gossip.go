package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gossip"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/protoconv"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

type gossipFlags struct {
	bind, advertise, keyFile, rack string
	seeds                          []string
	local                          bool
}

func (g *gossipFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.bind, "gossip-bind", ":7946", "memberlist address (TCP and UDP)")
	fs.StringVar(&g.advertise, "gossip-advertise", "", "address peers reach this member at (default: the bind address)")
	fs.StringArrayVar(&g.seeds, "gossip-seed", nil, "gossip member to join, host:port, repeatable (added to the JoinBundle's seeds)")
	fs.StringVar(&g.keyFile, "gossip-key-file", "", "rack gossip key as hex in a file, for agents without a JoinBundle")
	fs.StringVar(&g.rack, "rack", "", "rack name when there is no JoinBundle")
	fs.BoolVar(&g.local, "gossip-local", false, "memberlist loopback timings (fast failure detection; tests and labs)")
}

// rackGossip adapts the monitor and the gossip agent to each other and to the API.
type rackGossip struct {
	agent *gossip.Agent
	rack  string
	mon   *monitor.Monitor
	image string
}

// startGossip starts gossip when a rack key is configured; nil otherwise.
func startGossip(ctx context.Context, f *runFlags, bundle *bootv1.JoinBundle, node, image string, mon *monitor.Monitor, log *slog.Logger) (*rackGossip, error) {
	g := f.gossip
	var key []byte
	rack := g.rack
	seeds := append([]string{}, g.seeds...)
	if bundle.GetGossip() != nil && len(bundle.GetGossip().GetKey()) > 0 {
		key = bundle.GetGossip().GetKey()
		rack = bundle.GetGossip().GetRack()
		seeds = append(seeds, bundle.GetGossip().GetSeeds()...)
	} else if g.keyFile != "" {
		data, err := os.ReadFile(g.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		if key, err = hex.DecodeString(strings.TrimSpace(string(data))); err != nil {
			return nil, fmt.Errorf("--gossip-key-file %s: not hex: %w", g.keyFile, err)
		}
	}
	if key == nil {
		log.Info("no gossip: no rack key (JoinBundle gossip settings or --gossip-key-file)")
		return nil, nil
	}
	r := &rackGossip{rack: rack, mon: mon, image: image}
	a, err := gossip.Start(gossip.Config{Name: node, Rack: rack, Key: key, BindAddr: g.bind, AdvertiseAddr: g.advertise,
		Seeds: seeds, Local: g.local, Meta: r.meta, Log: log, RetryJoin: true,
		OnChange: func(c gossip.Change, m gossip.Member) {
			log.Info("rack member changed", "member", m.Name, "change", c, "state", m.State, "health", health.State(m.Meta.State))
			mon.Broker().Publish(monitor.Event{Time: time.Now(), Other: memberEvent{c, m}})
		}})
	if err != nil {
		return nil, err
	}
	r.agent = a
	log.Info("gossiping", "rack", rack, "address", a.Address(), "seeds", seeds)
	// Announce every health change at once.
	sub := mon.Broker().Subscribe()
	var once sync.Once
	go func() {
		defer once.Do(sub.Close)
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-sub.C:
				if !ok {
					sub = mon.Broker().Subscribe()
					continue
				}
				if e.Health != nil {
					if err := a.Announce(); err != nil {
						log.Warn("gossip announce", "error", err)
					}
				}
			}
		}
	}()
	return r, nil
}

type memberEvent struct {
	change gossip.Change
	member gossip.Member
}

func (r *rackGossip) meta() gossip.Meta {
	s := r.mon.Health()
	fig := r.mon.Figures()
	m := gossip.Meta{State: uint8(s.State), Failing: s.Failing, ImageID: r.image, GPUs: uint8(min(s.GPUCount, 255)),
		HealthyGPUs: uint8(min(s.HealthyGPUs, 255)), MaxTemperatureC: float32(fig.MaxTemperatureC),
		PCIeReplaysPerMin: float32(fig.PCIeReplaysPerMin), ECCCorrectedPerHour: float32(fig.ECCCorrectedPerHour)}
	if last := r.mon.Last(); last != nil {
		m.Driver = last.Snapshot.Driver.Version
	}
	return m
}

func (r *rackGossip) leave() { r.agent.Leave() }

// peers is nil-safe: the monitor asks before gossip has started.
func (r *rackGossip) peers() []checks.Peer {
	if r == nil || r.agent == nil {
		return nil
	}
	var out []checks.Peer
	for name, f := range r.agent.PeerFigures() {
		out = append(out, checks.Peer{Node: name, Figures: checks.Figures{MaxTemperatureC: f[0], PCIeReplaysPerMin: f[1], ECCCorrectedPerHour: f[2]}})
	}
	return out
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

func (r *rackGossip) member(m gossip.Member) *agentv1.RackMember {
	var h *machinev1.HealthSummary
	if m.Self {
		h = protoconv.Health(r.mon.Health())
	} else {
		h = &machinev1.HealthSummary{State: protoconv.HealthState(health.State(m.Meta.State)), FailingCheckIds: m.Meta.Failing,
			GpuCount: uint32(m.Meta.GPUs), HealthyGpuCount: uint32(m.Meta.HealthyGPUs), GpuHealthy: health.State(m.Meta.State) != health.Unhealthy}
	}
	return &agentv1.RackMember{NodeName: m.Name, Address: m.Address, State: memberState(m.State), Health: h,
		ImageId: m.Meta.ImageID, DriverVersion: m.Meta.Driver, Self: m.Self, Observer: m.Meta.Observer, UpdatedAt: timestamppb.New(m.UpdatedAt)}
}

func (r *rackGossip) view() *agentv1.RackView {
	v := &agentv1.RackView{Rack: r.rack}
	for _, m := range r.agent.Members() {
		v.Members = append(v.Members, r.member(m))
	}
	return v
}

func (r *rackGossip) counts() map[string]int {
	out := map[string]int{"alive": 0, "suspect": 0, "dead": 0, "left": 0}
	for _, m := range r.agent.Members() {
		out[m.State.String()]++
	}
	return out
}

func (r *rackGossip) render(x any) (agentv1.EventKind, *agentv1.Event) {
	me, ok := x.(memberEvent)
	if !ok {
		return 0, nil
	}
	change := map[gossip.Change]agentv1.MemberChange{gossip.Joined: agentv1.MemberChange_MEMBER_CHANGE_JOINED,
		gossip.Updated: agentv1.MemberChange_MEMBER_CHANGE_UPDATED, gossip.LeftGracefully: agentv1.MemberChange_MEMBER_CHANGE_LEFT,
		gossip.Failed: agentv1.MemberChange_MEMBER_CHANGE_FAILED}[me.change]
	return agentv1.EventKind_EVENT_KIND_GOSSIP_MEMBER, &agentv1.Event{Payload: &agentv1.Event_MemberChanged{
		MemberChanged: &agentv1.GossipMemberChanged{Change: change, Member: r.member(me.member)}}}
}

package node

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/gossip"
	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/server"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// GossipConfig is the rack gossip set up by flags; a JoinBundle's gossip settings
// take precedence over KeyFile and Rack.
type GossipConfig struct {
	// Bind and Advertise are memberlist addresses (host:port).
	Bind, Advertise string
	// Seeds are added to the JoinBundle's.
	Seeds []string
	// KeyFile holds the rack key as hex, for agents without a JoinBundle.
	KeyFile string
	Rack    string
	// Local uses memberlist's loopback timings (tests and labs).
	Local bool
}

// rackGossip adapts the monitor and the gossip agent to each other and to the API.
type rackGossip struct {
	agent *gossip.Agent
	rack  string
	mon   *monitor.Monitor
	image string
}

// gossipService announces every health change to the rack at once, and leaves the
// rack when it stops.
type gossipService struct {
	statusCell
	rack *rackGossip
	log  *slog.Logger
}

// startGossip joins the rack when a rack key is configured; nil otherwise. The
// member is up when it returns; its service announces health changes.
func startGossip(g GossipConfig, bundle *bootv1.JoinBundle, node, image string, mon *monitor.Monitor, log *slog.Logger) (*gossipService, error) {
	var key []byte
	var accepted [][]byte
	rack := g.Rack
	seeds := append([]string{}, g.Seeds...)
	if bundle.GetGossip() != nil && len(bundle.GetGossip().GetKey()) > 0 {
		key = bundle.GetGossip().GetKey()
		accepted = bundle.GetGossip().GetAcceptedKeys()
		rack = bundle.GetGossip().GetRack()
		seeds = append(seeds, bundle.GetGossip().GetSeeds()...)
	} else if g.KeyFile != "" {
		data, err := os.ReadFile(g.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		if key, err = hex.DecodeString(strings.TrimSpace(string(data))); err != nil {
			return nil, fmt.Errorf("--gossip-key-file %s: not hex: %w", g.KeyFile, err)
		}
	}
	if key == nil {
		log.Info("no gossip: no rack key (JoinBundle gossip settings or --gossip-key-file)")
		return nil, nil
	}
	r := &rackGossip{rack: rack, mon: mon, image: image}
	a, err := gossip.Start(gossip.Config{Name: node, Rack: rack, Key: key, AcceptedKeys: accepted, BindAddr: g.Bind, AdvertiseAddr: g.Advertise,
		Seeds: seeds, Local: g.Local, Meta: r.meta, Log: log, RetryJoin: true,
		OnChange: func(c gossip.Change, m gossip.Member) {
			log.Info("rack member changed", "member", m.Name, "change", c, "state", m.State, "health", health.State(m.Meta.State))
			mon.Broker().Publish(monitor.Event{Time: time.Now(), Member: &monitor.MemberChange{Change: c, Member: m}})
		}})
	if err != nil {
		return nil, err
	}
	r.agent = a
	log.Info("gossiping", "rack", rack, "address", a.Address(), "seeds", seeds)
	s := &gossipService{rack: r, log: log}
	s.set(Starting, "member of rack "+rack+" at "+a.Address())
	return s, nil
}

func (s *gossipService) Name() string { return "gossip" }

// close leaves the rack for a service that never ran.
func (s *gossipService) close() { s.rack.agent.Leave() }

func (s *gossipService) Run(ctx context.Context) error {
	s.set(Running, "member of rack "+s.rack.rack+" at "+s.rack.agent.Address())
	monitor.Follow(ctx, s.rack.mon.Broker(), func(e monitor.Event) {
		if e.Health == nil {
			return
		}
		if err := s.rack.agent.Announce(); err != nil {
			s.log.Warn("gossip announce", "error", err)
		}
	}, nil)
	s.rack.agent.Leave()
	return nil
}

// keyringDigest names the key ring in use, for heartbeats; nil-safe (no gossip: "").
func (r *rackGossip) keyringDigest() string {
	if r == nil || r.agent == nil {
		return ""
	}
	return bootv1.GossipKeyringDigest(r.agent.Keys())
}

// useKeys installs the rack key ring a heartbeat answer brought (a rotation step,
// CONTRACTS §3). nil-safe; a ring for another rack is refused.
func (r *rackGossip) useKeys(g *bootv1.GossipConfig, log *slog.Logger) {
	if r == nil || r.agent == nil || g == nil || len(g.GetKey()) == 0 {
		return
	}
	if g.GetRack() != "" && g.GetRack() != r.rack {
		log.Warn("gossip key ring for another rack ignored", "rack", r.rack, "ring_rack", g.GetRack())
		return
	}
	before := r.keyringDigest()
	if err := r.agent.SetKeys(g.GetKey(), g.GetAcceptedKeys()); err != nil {
		log.Error("gossip key ring from gpuboot not installed", "error", err)
		return
	}
	if after := r.keyringDigest(); after != before {
		log.Info("gossip key ring changed", "rack", r.rack, "ring", after, "primary", bootv1.GossipKeyFingerprint(g.GetKey()), "accepted", len(g.GetAcceptedKeys()))
	}
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

// peers is nil-safe: the monitor asks before gossip has started.
func (r *rackGossip) peers() []checks.Peer {
	if r == nil || r.agent == nil {
		return nil
	}
	var out []checks.Peer
	for name, f := range r.agent.PeerFigures() {
		out = append(out, checks.Peer{Node: name, Figures: checks.Figures{MaxTemperatureC: f.MaxTemperatureC,
			PCIeReplaysPerMin: f.PCIeReplaysPerMin, ECCCorrectedPerHour: f.ECCCorrectedPerHour}})
	}
	return out
}

func (r *rackGossip) view() *agentv1.RackView {
	v := &agentv1.RackView{Rack: r.rack}
	self := r.mon.Health()
	for _, m := range r.agent.Members() {
		v.Members = append(v.Members, server.RackMember(m, self))
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

// Package gossip shares node health within a rack over hashicorp/memberlist: each
// agent announces a compact health summary (Meta) as its node metadata, re-announces
// it at once when health changes, and keeps the rack view (every member, its liveness
// and its last announced health) that Status returns and rack.peer-outlier compares.
//
// Gossip is encrypted with the rack's key from the JoinBundle; a member with another
// key cannot join. This package does not judge health: agent/health does, and
// agent/checks compares peers.
package gossip

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// MemberState is a member's liveness.
type MemberState int

// Member states.
const (
	Alive MemberState = iota + 1
	Suspect
	Dead
	Left
)

func (s MemberState) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return "unknown"
}

// Member is one rack member as this agent sees it.
type Member struct {
	Name      string
	Address   string
	State     MemberState
	Meta      Meta
	MetaErr   string // why Meta could not be decoded, if it could not
	Self      bool
	UpdatedAt time.Time
}

// Change is what happened to a member.
type Change int

// Changes.
const (
	Joined Change = iota + 1
	Updated
	LeftGracefully
	Failed
)

// Config configures an Agent.
type Config struct {
	// Name is the node name (memberlist member name).
	Name string
	// Rack names the rack; it is the memberlist label, so racks do not mix.
	Rack string
	// Key is the rack's AES key: 16, 24 or 32 bytes. Required. The member encrypts
	// with it.
	Key []byte
	// AcceptedKeys are further keys the member decrypts with, during a key rotation
	// (SetKeys changes the ring later).
	AcceptedKeys [][]byte
	// BindAddr is host:port to listen on (TCP and UDP); port 0 picks one.
	BindAddr string
	// AdvertiseAddr is host:port others reach this member at; empty: BindAddr.
	AdvertiseAddr string
	// Seeds are members to join, host:port; this member's own address is skipped.
	Seeds []string
	// Local uses memberlist's loopback timings (fast failure detection, for tests)
	// instead of RackConfig.
	Local bool
	// Transport replaces the network (memberlist.MockNetwork in benchmarks).
	Transport memberlist.Transport
	// Meta returns the metadata to announce now.
	Meta func() Meta
	// RetryJoin keeps trying the seeds in the background (1 s doubling to 30 s) when
	// none answers at start, instead of failing Start: a rack's seeds may be rebooting.
	RetryJoin bool
	// Tune, when set, adjusts memberlist's configuration last (tests and benchmarks).
	Tune func(*memberlist.Config)
	// OnChange is called for every membership or metadata change (not for self).
	OnChange func(Change, Member)
	Log      *slog.Logger
}

// Agent is one rack member.
type Agent struct {
	cfg  Config
	ml   *memberlist.Memberlist
	ring *memberlist.Keyring
	stop chan struct{}
	once sync.Once

	mu      sync.Mutex
	members map[string]*Member
}

// RackConfig is the memberlist configuration every agent uses (decision 0206):
// memberlist's LAN defaults, tuned so that a health change reaches a rack of hundreds
// of members in well under a second of protocol time.
//
//   - GossipInterval 100 ms and GossipNodes 4 (LAN: 200 ms, 3): each member that
//     holds a change passes it to 4 random members every 100 ms, so the change
//     reaches 500 members in about 0.4 s of protocol time instead of 0.9 s. A
//     gossip round sends nothing when no broadcast is queued, so an idle rack pays
//     nothing for it.
//   - RetransmitMult stays 4: each member sends a change 4 × ⌈log10(N+1)⌉ times
//     (12 at N = 500), which makes a member that never hears it unlikely (about
//     e^-12 each); fewer would leave members waiting for a push-pull.
//   - EnableCompression false (LAN: true): memberlist LZW-compresses every packet,
//     which costs CPU on every send and receive while the packed health metadata
//     (decision 0202) does not compress.
//   - UDPBufferSize stays 1400 bytes, which fits a 1500-byte MTU management network
//     without fragmentation.
//   - ProbeInterval 5 s and ProbeTimeout 3 s (LAN: 1 s, 500 ms): GPU nodes run jobs
//     that keep every core busy, and a member that answers a probe late is
//     suspected; suspicions and their refutations go through the same broadcast
//     queue as health changes and delay them. A crashed node is Kubernetes' and
//     gpuboot's to notice (node lease, heartbeats); here it only leaves peer
//     comparison, after about 30 s (32 members) to 60 s (500) instead of 5–15 s.
//
// Bandwidth: a change costs each member 12 packets of about 300 bytes over 0.3 s
// (about 12 KB/s while it spreads, 3.6 KB per change; LAN defaults spread the same
// 12 packets over 0.8 s). Idle, a member sends about 60 bytes/s of probes and, at
// 500 members, about 1.3 KB/s of push-pull state sync (memberlist's LAN default of
// every 30 s, which it stretches to every 150 s at that size; unchanged).
func RackConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.GossipInterval = 100 * time.Millisecond
	c.GossipNodes = 4
	c.EnableCompression = false
	c.ProbeInterval = 5 * time.Second
	c.ProbeTimeout = 3 * time.Second
	return c
}

// Start creates the member and joins the seeds (joining fails only when no seed
// answers; an empty seed list starts a new rack).
func Start(cfg Config) (*Agent, error) {
	if err := checkKeys(cfg.Key, cfg.AcceptedKeys); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, members: map[string]*Member{}, stop: make(chan struct{})}
	mc := RackConfig()
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
	}
	mc.Name = cfg.Name
	mc.Label = "gpurack/" + cfg.Rack
	ring, err := memberlist.NewKeyring(cfg.AcceptedKeys, cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("gossip: key ring: %w", err)
	}
	a.ring = ring
	mc.Keyring = ring
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.Delegate = (*delegate)(a)
	mc.Events = (*events)(a)
	mc.LogOutput = nil
	mc.Logger = log.New(slogWriter{cfg.Log}, "", 0)
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
	} else {
		host, port, err := splitHostPort(cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("gossip bind address: %w", err)
		}
		mc.BindAddr, mc.BindPort = host, port
		mc.AdvertisePort = port
		if cfg.AdvertiseAddr != "" {
			ah, ap, err := splitHostPort(cfg.AdvertiseAddr)
			if err != nil {
				return nil, fmt.Errorf("gossip advertise address: %w", err)
			}
			mc.AdvertiseAddr, mc.AdvertisePort = ah, ap
		}
	}
	if cfg.Tune != nil {
		cfg.Tune(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	a.ml = ml
	self := ml.LocalNode()
	var seeds []string
	for _, s := range cfg.Seeds {
		if s != self.Address() && s != cfg.AdvertiseAddr && s != cfg.BindAddr {
			seeds = append(seeds, s)
		}
	}
	if len(seeds) > 0 {
		if _, err := ml.Join(seeds); err != nil {
			err = fmt.Errorf("gossip: join %v: %w (wrong rack key, or no seed reachable)", seeds, err)
			if !cfg.RetryJoin {
				ml.Shutdown()
				return nil, err
			}
			cfg.Log.Warn("gossip: no seed answered; retrying in the background", "error", err)
			go a.retryJoin(seeds)
		}
	}
	return a, nil
}

// checkKeys checks a key ring's sizes before memberlist sees it.
func checkKeys(primary []byte, accepted [][]byte) error {
	for i, k := range append([][]byte{primary}, accepted...) {
		switch len(k) {
		case 16, 24, 32:
		default:
			what := "key"
			if i > 0 {
				what = fmt.Sprintf("accepted key %d", i)
			}
			return fmt.Errorf("gossip: %s is %d bytes; want 16, 24 or 32 (AES-128/192/256)", what, len(k))
		}
	}
	return nil
}

// SetKeys makes primary the key this member encrypts with and accepted the others it
// decrypts with, dropping any other key: one step of a key rotation that gpuboot
// drives (CONTRACTS §3). Keys are installed before the primary changes, and dropped
// after, so the member never stops understanding a peer that is one step behind.
func (a *Agent) SetKeys(primary []byte, accepted [][]byte) error {
	if err := checkKeys(primary, accepted); err != nil {
		return err
	}
	for _, k := range append([][]byte{primary}, accepted...) {
		if err := a.ring.AddKey(k); err != nil {
			return fmt.Errorf("gossip: add key: %w", err)
		}
	}
	if err := a.ring.UseKey(primary); err != nil {
		return fmt.Errorf("gossip: use key: %w", err)
	}
	keep := append([][]byte{primary}, accepted...)
	for _, k := range a.ring.GetKeys() {
		if !slices.ContainsFunc(keep, func(x []byte) bool { return bytes.Equal(x, k) }) {
			if err := a.ring.RemoveKey(k); err != nil {
				return fmt.Errorf("gossip: remove key: %w", err)
			}
		}
	}
	return nil
}

// Keys returns the key this member encrypts with and the others it accepts.
func (a *Agent) Keys() (primary []byte, accepted [][]byte) {
	primary = a.ring.GetPrimaryKey()
	for _, k := range a.ring.GetKeys() {
		if !bytes.Equal(k, primary) {
			accepted = append(accepted, k)
		}
	}
	return primary, accepted
}

func (a *Agent) retryJoin(seeds []string) {
	wait := time.Second
	for {
		select {
		case <-a.stop:
			return
		case <-time.After(wait):
		}
		if _, err := a.ml.Join(seeds); err == nil {
			a.cfg.Log.Info("gossip: joined the rack", "seeds", seeds)
			return
		} else {
			a.cfg.Log.Warn("gossip: join failed", "seeds", seeds, "error", err)
		}
		wait = min(2*wait, 30*time.Second)
	}
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return h, n, nil
}

// Address is where this member listens, host:port.
func (a *Agent) Address() string { return a.ml.LocalNode().Address() }

// Announce re-broadcasts this member's metadata now (call it when health changes).
func (a *Agent) Announce() error { return a.ml.UpdateNode(5 * time.Second) }

// Leave tells the rack this member leaves, then shuts it down.
func (a *Agent) Leave() {
	a.once.Do(func() { close(a.stop) })
	a.ml.Leave(2 * time.Second)
	a.ml.Shutdown()
}

// Kill stops the member without telling anyone (tests: a crashed node).
func (a *Agent) Kill() {
	a.once.Do(func() { close(a.stop) })
	a.ml.Shutdown()
}

// Members returns every member seen, including self and dead ones, by name.
func (a *Agent) Members() []Member {
	out := []Member{a.self()}
	a.mu.Lock()
	for _, m := range a.members {
		out = append(out, *m)
	}
	a.mu.Unlock()
	// memberlist's own view may say suspect.
	for _, n := range a.ml.Members() {
		for i := range out {
			if out[i].Name == n.Name && n.State == memberlist.StateSuspect && !out[i].Self {
				out[i].State = Suspect
			}
		}
	}
	slices.SortFunc(out, func(x, y Member) int {
		switch {
		case x.Name < y.Name:
			return -1
		case x.Name > y.Name:
			return 1
		}
		return 0
	})
	return out
}

func (a *Agent) self() Member {
	n := a.ml.LocalNode()
	m := Member{Name: n.Name, Address: n.Address(), State: Alive, Self: true, UpdatedAt: time.Now()}
	if a.cfg.Meta != nil {
		m.Meta = a.cfg.Meta()
	}
	return m
}

func (a *Agent) record(n *memberlist.Node, st MemberState) (Member, bool) {
	if n.Name == a.cfg.Name {
		return Member{}, false
	}
	m := Member{Name: n.Name, Address: n.Address(), State: st, UpdatedAt: time.Now()}
	meta, err := DecodeMeta(n.Meta)
	if err != nil {
		m.MetaErr = err.Error()
	} else {
		m.Meta = meta
	}
	a.mu.Lock()
	if old, ok := a.members[n.Name]; ok && err != nil {
		m.Meta = old.Meta // keep the last good metadata of a dead member
	}
	a.members[n.Name] = &m
	a.mu.Unlock()
	return m, true
}

type delegate Agent

func (d *delegate) NodeMeta(limit int) []byte {
	if d.cfg.Meta == nil {
		return nil
	}
	b := d.cfg.Meta().Encode()
	if len(b) > limit {
		return nil
	}
	return b
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

type events Agent

func (e *events) notify(c Change, n *memberlist.Node, st MemberState) {
	a := (*Agent)(e)
	m, ok := a.record(n, st)
	if ok && a.cfg.OnChange != nil {
		a.cfg.OnChange(c, m)
	}
}

func (e *events) NotifyJoin(n *memberlist.Node)   { e.notify(Joined, n, Alive) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.notify(Updated, n, Alive) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	if n.State == memberlist.StateLeft {
		e.notify(LeftGracefully, n, Left)
		return
	}
	e.notify(Failed, n, Dead)
}

// Figures are a peer's comparable figures as its metadata carries them (NaN where the
// peer does not know one).
type Figures struct {
	MaxTemperatureC, PCIeReplaysPerMin, ECCCorrectedPerHour float64
}

// PeerFigures returns the alive, non-observer peers' figures by member name
// (rack.peer-outlier input), excluding self.
func (a *Agent) PeerFigures() map[string]Figures {
	out := map[string]Figures{}
	for _, m := range a.Members() {
		if m.Self || m.State != Alive || m.Meta.Observer || m.MetaErr != "" {
			continue
		}
		out[m.Name] = Figures{MaxTemperatureC: f64(m.Meta.MaxTemperatureC), PCIeReplaysPerMin: f64(m.Meta.PCIeReplaysPerMin),
			ECCCorrectedPerHour: f64(m.Meta.ECCCorrectedPerHour)}
	}
	return out
}

func f64(f float32) float64 {
	if math.IsNaN(float64(f)) {
		return math.NaN()
	}
	return float64(f)
}

// slogWriter routes memberlist's log lines ("[DEBUG] memberlist: …") into slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	s := string(p)
	lvl := slog.LevelDebug
	switch {
	case len(s) > 6 && s[:6] == "[WARN]":
		lvl = slog.LevelWarn
	case len(s) > 5 && s[:5] == "[ERR]":
		lvl = slog.LevelError
	}
	w.l.Log(context.Background(), lvl, "memberlist", "line", trimNL(s))
	return len(p), nil
}

func trimNL(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}

var _ io.Writer = slogWriter{}

func (c Change) String() string {
	switch c {
	case Joined:
		return "joined"
	case Updated:
		return "updated"
	case LeftGracefully:
		return "left"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Package enroll is gpuboot's enrollment logic: what a boot request, an agent's
// Register, GetJoinBundle, ReportCommissioning and Heartbeat, an operator's decision
// and a Node registering do to a machine's inventory record (CONTRACTS §2), and the
// JoinBundle it releases once (CONTRACTS §4).
//
// Service implements gpurack.boot.v1.EnrollmentService (the gRPC surface agents call)
// and the operations pxe/admin (operators), pxe/nodecontrol (Node watch) and the
// /boot.ipxe handler (DecideBoot) call. Every change goes through the lifecycle table of
// pxe/inventory and is stored with its transitions in one transaction. Nothing is
// decided on a source IP or MAC address: secrets go only to the holder of the key an
// approval bound, once, against a one-time token and a signed challenge.
//
// It is not the store (pxe/inventory), the approval rules (pxe/policy) or the
// Kubernetes side (pxe/nodecontrol implements Cluster).
package enroll

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// UnknownMachines says what a boot request from an unknown identity gets.
type UnknownMachines string

// The unknownMachines settings (CONTRACTS §2.2).
const (
	// Discover boots the rack's default image so its agent can register and report.
	Discover UnknownMachines = "discover"
	// Hold answers with a script that waits for approval.
	Hold UnknownMachines = "hold"
)

// Reenroll says what a new key for an approved identity whose old key is gone gets
// (CONTRACTS §2.8).
type Reenroll string

// The reenroll settings.
const (
	ReenrollAuto   Reenroll = "auto"
	ReenrollManual Reenroll = "manual"
)

// Defaults of Config.
const (
	DefaultTokenTTL      = 5 * time.Minute
	DefaultBootstrapTTL  = 15 * time.Minute
	DefaultMaxUnapproved = 1000
	// DefaultMaxUnapprovedBytes bounds the bytes those records hold (recordBytes):
	// about 100 records of the largest facts and checklist an agent may send, or
	// thousands of real ones (about 8 kB each).
	DefaultMaxUnapprovedBytes = 64 << 20
	DefaultCreateRate         = 5 // records per second
	DefaultCreateBurst        = 50
	DefaultHeartbeatEvery     = 10 * time.Second
	DefaultPollEvery          = 10 * time.Second
)

// Cluster is the Kubernetes side gpuboot needs for enrollment: the API endpoint and CA
// nodes use (from the enroller kubeconfig), per-machine bootstrap tokens and Node
// deletion. pxe/nodecontrol implements it with the enroller credential.
type Cluster interface {
	// Endpoint is the API server URL nodes use; CAPEM the cluster CA certificate.
	Endpoint() string
	CAPEM() string
	// MintBootstrapToken creates a bootstrap token for nodeName valid for ttl and
	// returns its id and the full "id.secret" token.
	MintBootstrapToken(ctx context.Context, nodeName string, ttl time.Duration) (id, token string, err error)
	// DeleteBootstrapToken deletes the token with id; a missing token is not an error.
	DeleteBootstrapToken(ctx context.Context, id string) error
	// DeleteNode deletes the Node; a missing Node is not an error.
	DeleteNode(ctx context.Context, name string) error
}

// Rack is one rack's enrollment settings.
type Rack struct {
	Name string
	// DefaultImage is booted by machines no selector matches.
	DefaultImage string
	// GossipKey is the rack's memberlist key (16, 24 or 32 bytes).
	GossipKey []byte
}

// Config configures a Service.
type Config struct {
	Store     inventory.Store
	Policy    policy.Policy
	Selectors []policy.Selector
	// Racks by name; DefaultRack is where machines the allowlist does not place go.
	Racks       map[string]Rack
	DefaultRack string
	// GossipKeyDir, when set, holds each rack's gossip key ring as RACK.key
	// (GossipRing); the rings there replace Rack.GossipKey and rotations are saved
	// there. Empty: rings start from Rack.GossipKey and live in memory.
	GossipKeyDir string

	UnknownMachines UnknownMachines
	Reenroll        Reenroll
	// Identity is what a machine's identity rests on; default IdentityMACUUIDSerial.
	// With IdentityTPM or IdentityTPMOrFallback a key that proves the bound EK
	// re-enrolls without an operator whatever Reenroll says, and Reenroll applies to
	// identities not bound to an EK (decision 0651).
	Identity IdentityMode
	// EKRoots, when set, are the TPM vendors' CAs every EK certificate must chain to
	// (decision 0653); nil: the EK is trusted on first use.
	EKRoots *EKRoots

	// CA is the gpurack CA: it issues agent certificates. Revocations is gpuboot's
	// revocation list; RevocationsPath, when set, is where it is saved after a change.
	CA              *pki.CA
	Revocations     *pki.RevocationList
	RevocationsPath string

	// Cluster is optional: without it a JoinBundle carries no Kubernetes endpoint or
	// bootstrap token (a lab without a control plane yet).
	Cluster       Cluster
	ClusterDNS    []string
	ClusterDomain string
	// PodNetwork, when a field is set, goes to nodes in their bundle (gpuboot's
	// cluster.podNetwork).
	PodNetwork *bootv1.PodNetwork
	// LogsEndpoint, when set, goes to nodes in their bundle (logs_endpoint, gpuboot's
	// cluster.logsEndpoint): HOST:PORT of the log store's gateway.
	LogsEndpoint string
	// Registry, when set, goes to nodes in their bundle (registry, gpuboot's
	// cluster.registry): HOST:PORT of the cluster's image registry.
	Registry string
	// APIServers, the cluster's other API servers as HOST:PORT (gpuboot's
	// cluster.apiServers), go to nodes in their bundle (api_servers) after the host of
	// the enroller kubeconfig's endpoint.
	APIServers []string

	// NodeNamePrefix starts generated node names; default "gpu".
	NodeNamePrefix string

	// BMC reaches machines' BMCs for PowerMachine; its zero value has no accounts, and
	// PowerMachine then says to create bmc-credentials.yaml.
	BMC BMCAccess

	// AllowSimulated lets a machine whose commissioning report is marked simulated
	// become ready; without it such a machine goes quarantined (CONTRACTS §11).
	AllowSimulated bool

	// Bounds on records created by unauthenticated traffic: at most MaxUnapproved
	// machines in discovered or registered, created at CreateRate per second with
	// CreateBurst.
	MaxUnapproved int
	CreateRate    float64
	CreateBurst   int
	// MaxUnapprovedBytes bounds what those records hold, in bytes as stored
	// (recordBytes): past it a new record is refused, and so is a Register or
	// Heartbeat that would make one of them larger. Machines an approval bound are
	// never refused or evicted for it. Default DefaultMaxUnapprovedBytes.
	MaxUnapprovedBytes int64

	TokenTTL     time.Duration
	BootstrapTTL time.Duration
	// AgentCertValidity is how long an agent certificate is valid, in the JoinBundle
	// and at each renewal (RenewAgentCertificate); default pki.DefaultLeafValidity
	// (gpuboot.yaml's enrollment.agentCertValidity).
	AgentCertValidity time.Duration

	// Now is the clock; default time.Now.
	Now func() time.Time
	Log *slog.Logger
	// OnChange, when set, is called with a copy of a machine after it is created and
	// after a stored change of its state or node name; not for changes of anything
	// else (a heartbeat's health and times, keys, facts). The node controller uses it
	// to act on ready and decommissioned machines; a call per heartbeat would make its
	// work grow with the square of the machine count.
	OnChange func(*inventory.Machine)
}

// Service is the enrollment logic. It is safe for concurrent use.
type Service struct {
	bootv1.UnimplementedEnrollmentServiceServer

	cfg     Config
	store   inventory.Store
	log     *slog.Logger
	limiter *rate.Limiter

	// unapproved counts machines in discovered or registered, and unapprovedBytes
	// the recordBytes they hold, for the caps.
	mu              sync.Mutex
	unapproved      int
	unapprovedBytes int64

	locks sync.Map   // machine id → *sync.Mutex, serialising bundle releases
	rowMu sync.Mutex // serialises approvals through an allowlist row (one row, one machine)
	power sync.Map   // machine id → a power action under way (PowerMachine)
	names sync.Mutex

	rings *rings // gossip key rings by rack

	tpm tpmChallenges

	renewals renewals // when each machine last renewed its agent certificate

	stats counters
}

// counters count enrollment events (exported as metrics by the server).
type counters struct {
	mu               sync.Mutex
	Registrations    map[string]uint64 // by answer
	BundlesReleased  uint64
	BundlesRefused   map[string]uint64 // by gRPC code
	CreationsLimited uint64
}

// New returns a Service over cfg. It counts the unapproved records in the store.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("enroll: no inventory store")
	}
	if cfg.CA == nil {
		return nil, errors.New("enroll: no gpurack CA (run `gpuboot init` first)")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.UnknownMachines == "" {
		cfg.UnknownMachines = Discover
	}
	if cfg.Reenroll == "" {
		cfg.Reenroll = ReenrollAuto
	}
	switch cfg.Identity {
	case "":
		cfg.Identity = IdentityMACUUIDSerial
	case IdentityMACUUIDSerial, IdentityTPM, IdentityTPMOrFallback:
	default:
		return nil, fmt.Errorf("enroll: identity %q: use %s, %s or %s", cfg.Identity, IdentityMACUUIDSerial, IdentityTPM, IdentityTPMOrFallback)
	}
	if cfg.Revocations == nil {
		cfg.Revocations = pki.NewRevocationList()
	}
	if cfg.NodeNamePrefix == "" {
		cfg.NodeNamePrefix = "gpu"
	}
	if cfg.MaxUnapproved == 0 {
		cfg.MaxUnapproved = DefaultMaxUnapproved
	}
	if cfg.MaxUnapprovedBytes == 0 {
		cfg.MaxUnapprovedBytes = DefaultMaxUnapprovedBytes
	}
	if cfg.CreateRate == 0 {
		cfg.CreateRate = DefaultCreateRate
	}
	if cfg.CreateBurst == 0 {
		cfg.CreateBurst = DefaultCreateBurst
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.BootstrapTTL == 0 {
		cfg.BootstrapTTL = DefaultBootstrapTTL
	}
	if cfg.AgentCertValidity < 0 {
		return nil, fmt.Errorf("enroll: agent certificate validity %s is negative", cfg.AgentCertValidity)
	}
	if cfg.AgentCertValidity == 0 {
		cfg.AgentCertValidity = pki.DefaultLeafValidity
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Racks == nil {
		cfg.Racks = map[string]Rack{}
	}
	s := &Service{
		cfg:     cfg,
		store:   cfg.Store,
		log:     cfg.Log,
		limiter: rate.NewLimiter(rate.Limit(cfg.CreateRate), cfg.CreateBurst),
		stats:   counters{Registrations: map[string]uint64{}, BundlesRefused: map[string]uint64{}},
	}
	rs, err := newRings(cfg)
	if err != nil {
		return nil, fmt.Errorf("enroll: gossip keys: %w", err)
	}
	s.rings = rs
	all, err := cfg.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("enroll: read inventory: %w", err)
	}
	for _, m := range all {
		if unapproved(m.State) {
			s.unapproved++
			s.unapprovedBytes += recordBytes(m)
		}
	}
	return s, nil
}

// Snapshot returns a copy of the counters.
func (s *Service) Snapshot() (registrations map[string]uint64, released uint64, refused map[string]uint64, limited uint64) {
	s.stats.mu.Lock()
	defer s.stats.mu.Unlock()
	registrations = map[string]uint64{}
	for k, v := range s.stats.Registrations {
		registrations[k] = v
	}
	refused = map[string]uint64{}
	for k, v := range s.stats.BundlesRefused {
		refused[k] = v
	}
	return registrations, s.stats.BundlesReleased, refused, s.stats.CreationsLimited
}

func unapproved(st inventory.State) bool {
	return st == inventory.Discovered || st == inventory.Registered
}

// ErrLimited is returned when a new record would exceed the bounds on unauthenticated
// creations.
var ErrLimited = errors.New("too many unapproved machines or new machines too fast")

// admit reserves room for one new unapproved record of size bytes, or returns
// ErrLimited.
func (s *Service) admit(size int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unapproved >= s.cfg.MaxUnapproved || !s.limiter.Allow() {
		s.limited()
		return fmt.Errorf("%w (limit %d unapproved, %.0f/s): approve or reject waiting machines", ErrLimited, s.cfg.MaxUnapproved, s.cfg.CreateRate)
	}
	if s.unapprovedBytes+size > s.cfg.MaxUnapprovedBytes {
		s.limited()
		return bytesLimitError(s.unapprovedBytes, s.cfg.MaxUnapprovedBytes)
	}
	s.unapproved++
	s.unapprovedBytes += size
	return nil
}

func (s *Service) limited() {
	s.stats.mu.Lock()
	s.stats.CreationsLimited++
	s.stats.mu.Unlock()
}

func (s *Service) release(size int64) {
	s.mu.Lock()
	s.unapproved--
	s.unapprovedBytes -= size
	s.mu.Unlock()
}

// create stores a new machine after admit; on failure the reservation is released.
func (s *Service) create(ctx context.Context, m *inventory.Machine, ts ...inventory.Transition) error {
	size := recordBytes(m)
	if err := s.admit(size); err != nil {
		return err
	}
	if err := s.store.Create(ctx, m, ts...); err != nil {
		s.release(size)
		return err
	}
	if !unapproved(m.State) {
		s.release(size)
	}
	s.changed(m)
	return nil
}

// resize moves the bytes counted for one record from was to now (heldBytes before and
// after a change). A record unapproved before and after may not grow past
// MaxUnapprovedBytes; it returns the change it counted.
func (s *Service) resize(was, now int64, stays bool) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := now - was
	if stays && d > 0 && s.unapprovedBytes+d > s.cfg.MaxUnapprovedBytes {
		s.limited()
		return 0, bytesLimitError(s.unapprovedBytes, s.cfg.MaxUnapprovedBytes)
	}
	s.unapprovedBytes += d
	return d, nil
}

// heldBytes is the recordBytes m counts against MaxUnapprovedBytes: 0 unless it is
// unapproved.
func heldBytes(m *inventory.Machine) int64 {
	if !unapproved(m.State) {
		return 0
	}
	return recordBytes(m)
}

// update runs a store update and keeps the unapproved count and observers in step:
// OnChange hears of it only when the machine's state or node name changed.
func (s *Service) update(ctx context.Context, id string, fn func(*inventory.Machine) ([]inventory.Transition, error)) (*inventory.Machine, error) {
	var before inventory.State
	var beforeNode string
	var counted int64 // bytes resize counted for this change
	m, err := s.store.Update(ctx, id, func(m *inventory.Machine) ([]inventory.Transition, error) {
		s.resize(counted, 0, false) // a store that runs fn again
		counted = 0
		before, beforeNode = m.State, m.NodeName
		was := heldBytes(m)
		ts, err := fn(m)
		if err != nil {
			return nil, err
		}
		if counted, err = s.resize(was, heldBytes(m), unapproved(before) && unapproved(m.State)); err != nil {
			return nil, err
		}
		return ts, nil
	})
	if err != nil {
		s.resize(counted, 0, false)
		return nil, err
	}
	if a, b := unapproved(before), unapproved(m.State); a != b {
		s.mu.Lock()
		if a {
			s.unapproved--
		} else {
			s.unapproved++
		}
		s.mu.Unlock()
	}
	if m.State != before || m.NodeName != beforeNode {
		s.changed(m)
	}
	return m, nil
}

func (s *Service) changed(m *inventory.Machine) {
	if s.cfg.OnChange != nil {
		s.cfg.OnChange(m.Clone())
	}
}

func (s *Service) machineLock(id string) *sync.Mutex {
	l, _ := s.locks.LoadOrStore(id, new(sync.Mutex))
	return l.(*sync.Mutex)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return b
}

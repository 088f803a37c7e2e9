package inventory

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
	"time"

	"github.com/gpurack/gpurack/pxe/identity"
)

// KeyLiveness is how long a key stays live without a call (CONTRACTS §2.8: no heartbeat
// for 3 minutes).
const KeyLiveness = 3 * time.Minute

// Machine is one inventory entry. Protobuf payloads (facts, checklists, health) are
// kept as their binary encoding, so this package does not interpret them.
type Machine struct {
	// ID is assigned at creation (NewID) and never reused.
	ID string `json:"id"`
	// Identity is what the machine is (CONTRACTS §1); the store indexes it by
	// Identity.Key, MAC, UUID and serial together, never the UUID alone.
	Identity identity.Identity `json:"identity"`
	State    State             `json:"state"`
	// PreConflict is the state the machine had when it entered Conflict.
	PreConflict State `json:"preConflict,omitempty"`

	NodeName string            `json:"nodeName,omitempty"`
	Rack     string            `json:"rack,omitempty"`
	Slot     string            `json:"slot,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Profile  string            `json:"profile,omitempty"`
	ImageID  string            `json:"imageId,omitempty"`

	// BMC is the machine's BMC Redfish address ("https://host[:port]") from its rack
	// manifest row (policy.Entry.BMC); empty when the row names none. Power control
	// (pxe/bmc) uses it with the accounts in bmc-credentials.yaml.
	BMC string `json:"bmc,omitempty"`
	// ImagePin, when set, is the image a rollout gave the machine: it wins over every
	// selector and the rack's default until the rollout releases it (decision 0687).
	ImagePin *ImagePin `json:"imagePin,omitempty"`

	// Facts is the latest gpurack.machine.v1.MachineFacts from Register.
	Facts []byte `json:"facts,omitempty"`
	// Checklist is the latest gpurack.machine.v1.Checklist (any phase).
	Checklist []byte `json:"checklist,omitempty"`
	// CommissioningReport is the latest COMMISSIONING-phase checklist received while
	// joining, kept so the move to commissioning can apply it at once.
	CommissioningReport []byte `json:"commissioningReport,omitempty"`
	// Health is the latest gpurack.machine.v1.HealthSummary from Heartbeat.
	Health []byte `json:"health,omitempty"`
	// GPUAllocation is the latest gpurack.machine.v1.GPUAllocation from Heartbeat:
	// which pods hold the machine's GPUs, reported at GPUAllocationAt (zero: never;
	// an allocation of no holders encodes to no bytes).
	GPUAllocation   []byte    `json:"gpuAllocation,omitempty"`
	GPUAllocationAt time.Time `json:"gpuAllocationAt,omitzero"`
	// DataDisks is the latest gpurack.machine.v1.DataDisks from Heartbeat: the
	// machine's local disks as its agent last saw them, reported at DataDisksAt (zero:
	// never).
	DataDisks   []byte    `json:"dataDisks,omitempty"`
	DataDisksAt time.Time `json:"dataDisksAt,omitzero"`
	// PendingWipe is the data-disk wipe an operator asked for and the agent has not
	// reported on yet; nil when none. Heartbeat answers over mutual TLS carry it.
	PendingWipe *DataDiskWipe `json:"pendingWipe,omitempty"`

	LastHeartbeat time.Time `json:"lastHeartbeat,omitzero"`
	// GossipKeyring is the gossip key ring digest the agent's last heartbeat over
	// mutual TLS reported (bootv1.GossipKeyringDigest); a key rotation waits for it.
	GossipKeyring string `json:"gossipKeyring,omitempty"`

	// Keys registered for the identity: one normally, two while a newer key waits
	// for the older one to go away or while in conflict.
	Keys []Key `json:"keys,omitempty"`
	// BoundKey is the fingerprint of the key an approval bound; empty when none.
	BoundKey string `json:"boundKey,omitempty"`
	// EKHash is the TPM Endorsement Key the machine's identity is bound to
	// ("sha256:HEX", decision 0651): set when a key that proved it is bound, kept
	// across re-enrollments. With `identity: tpm` or `tpm-or-fallback` only a key that
	// proves this EK may take the identity; any other is a conflict. Empty: not bound.
	EKHash string `json:"ekHash,omitempty"`
	// EKCertificate is the EK certificate (DER) the TPM held when EKHash was bound;
	// empty when it held none.
	EKCertificate []byte `json:"ekCertificate,omitempty"`
	// Approval is the outstanding one-time token for the bound key.
	Approval *Approval `json:"approval,omitempty"`
	// AgentCertSerials are the serial numbers (hex) of agent certificates issued to
	// the machine and not yet revoked.
	AgentCertSerials []string `json:"agentCertSerials,omitempty"`
	// BootstrapTokenIDs are the ids of bootstrap tokens minted for it and not yet
	// deleted.
	BootstrapTokenIDs []string `json:"bootstrapTokenIds,omitempty"`

	// AllowlistSpent is set when the machine is decommissioned, or re-enrolls with a
	// new key under reenroll: manual: the allowlist row that matches it approved it
	// once and approves neither it nor another identity on the row again until an
	// operator approves it (which clears this). The record keeps it across the boot
	// that starts the machine over.
	AllowlistSpent bool `json:"allowlistSpent,omitempty"`

	LastBootAt time.Time `json:"lastBootAt,omitzero"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// ImagePin is the image a rollout pinned a machine to.
type ImagePin struct {
	Image   string    `json:"image"`
	Rollout string    `json:"rollout"`
	Since   time.Time `json:"since"`
}

// Key is one agent key registered for an identity.
type Key struct {
	Fingerprint  string    `json:"fingerprint"`
	PublicKey    []byte    `json:"publicKey"`
	RegisteredAt time.Time `json:"registeredAt"`
	LastSeen     time.Time `json:"lastSeen"`
	BootID       string    `json:"bootId,omitempty"`
	Remote       string    `json:"remote,omitempty"`
	// Ended marks a key whose liveness a boot request ended. gpuboot no longer sets it
	// (an unauthenticated boot request ends nothing, decision 0405); records written
	// before keep it until the key's next heartbeat clears it.
	Ended bool `json:"ended,omitempty"`
	// BundleReleased is set once the JoinBundle was released to this key.
	BundleReleased bool `json:"bundleReleased,omitempty"`
	// HeartbeatStartedAt and HeartbeatSeq are the agent process start and sequence
	// number of the latest heartbeat accepted from this key (late duplicates are
	// ignored).
	HeartbeatStartedAt time.Time `json:"heartbeatStartedAt,omitzero"`
	HeartbeatSeq       uint64    `json:"heartbeatSeq,omitempty"`
	// EKHash is the TPM Endorsement Key this key proved by credential activation
	// (decision 0650); empty when it proved none.
	EKHash string `json:"ekHash,omitempty"`
	// EKCertificate is the EK certificate (DER) its TPM sent; empty when none.
	EKCertificate []byte `json:"ekCertificate,omitempty"`
}

// Live reports whether the key is live at now: not ended by a boot request and seen
// within KeyLiveness.
func (k Key) Live(now time.Time) bool {
	return !k.Ended && now.Sub(k.LastSeen) < KeyLiveness
}

// Approval is an issued one-time JoinBundle token (CONTRACTS §2.3).
type Approval struct {
	Token          string    `json:"token"`
	Challenge      []byte    `json:"challenge"`
	KeyFingerprint string    `json:"keyFingerprint"`
	IssuedAt       time.Time `json:"issuedAt"`
	ExpiresAt      time.Time `json:"expiresAt"`
	Used           bool      `json:"used,omitempty"`
}

// DataDiskWipe is an operator's request to wipe one of a machine's data disks
// (AdminService.WipeDataDisk), kept until the agent reports what it did.
type DataDiskWipe struct {
	// ID is gpuboot's random id for the request; the agent's result names it.
	ID string `json:"id"`
	// Path and Serial name the disk: its device path and, as the operator's
	// confirmation, its serial. The agent refuses unless the disk at Path has Serial.
	Path   string `json:"path"`
	Serial string `json:"serial"`
	// Actor and Reason are who asked and why; RequestedAt is when.
	Actor       string    `json:"actor"`
	Reason      string    `json:"reason"`
	RequestedAt time.Time `json:"requestedAt"`
}

// Claimant reports whether m claims its hardware identity against other records: an
// approval bound it (Bound), it is in conflict, or it was retired with its allowlist
// approval spent. pxe/enroll lets one claimant hold an allowlist row; the store
// indexes claimants by MAC and serial (Store.Claimants).
func (m *Machine) Claimant() bool {
	return m.State.Bound() || m.State == Conflict || m.AllowlistSpent
}

// FindKey returns the index of the key with fingerprint fp in m.Keys, or -1.
func (m *Machine) FindKey(fp string) int {
	for i, k := range m.Keys {
		if k.Fingerprint == fp {
			return i
		}
	}
	return -1
}

// BoundBootID is the boot id the bound key registered with, "" when none is bound.
func (m *Machine) BoundBootID() string {
	if i := m.FindKey(m.BoundKey); i >= 0 {
		return m.Keys[i].BootID
	}
	return ""
}

// Clone returns a deep copy of m.
func (m *Machine) Clone() *Machine {
	c := *m
	if m.Labels != nil {
		c.Labels = make(map[string]string, len(m.Labels))
		for k, v := range m.Labels {
			c.Labels[k] = v
		}
	}
	c.Keys = append([]Key(nil), m.Keys...)
	if m.Approval != nil {
		a := *m.Approval
		c.Approval = &a
	}
	if m.PendingWipe != nil {
		w := *m.PendingWipe
		c.PendingWipe = &w
	}
	c.AgentCertSerials = append([]string(nil), m.AgentCertSerials...)
	c.BootstrapTokenIDs = append([]string(nil), m.BootstrapTokenIDs...)
	return &c
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns a fresh machine id: "m" followed by 16 random base32 characters
// (lowercase letters and digits, URL-safe, valid in a Kubernetes name).
func NewID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "m" + strings.ToLower(idEncoding.EncodeToString(b))
}

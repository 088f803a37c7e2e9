// Package rollout moves a set of gpuboot's machines to another image: canary first,
// then in batches, each machine pinned to the image, cordoned and drained, power-cycled
// through its BMC and waited for until it is ready on the image, and stopping by itself
// at the first failure (`gpuboot rollout`, docs/operations.md, decision 0687).
//
// It decides nothing about machines itself: pins, power and the inventory go through
// Machines (pxe/enroll), Nodes through Nodes (pxe/nodecontrol), and the image is checked
// through Images (pxe/httpboot) before any machine is touched. A rollout is a JSON file
// in gpuboot's state directory, rewritten atomically at every change, so a restarted
// gpuboot carries on where it was.
package rollout

import (
	"context"
	"errors"
	"time"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// Machines is what a rollout does to machines; pxe/enroll.Service implements it.
type Machines interface {
	// Resolve finds the machine an id, node name or boot MAC names.
	Resolve(ctx context.Context, ref string) (*inventory.Machine, error)
	// List returns every machine.
	List(ctx context.Context) ([]*inventory.Machine, error)
	// SelectorLabels are the labels a selector's match terms see for m.
	SelectorLabels(m *inventory.Machine) policy.Labels
	// NextImage is the image m gets at its next boot.
	NextImage(m *inventory.Machine) string
	// PinImage pins the machine with id to image for rollout (image "": removes the
	// pin), recorded in its history with actor and reason.
	PinImage(ctx context.Context, id, image, rollout, actor, reason string) (*inventory.Machine, error)
	// PowerMachine does action to the machine through its BMC.
	PowerMachine(ctx context.Context, ref string, action bmc.Action, actor, reason string) (*inventory.Machine, bmc.Result, error)
}

// Nodes cordons, drains and uncordons Kubernetes Nodes; pxe/nodecontrol implements it.
type Nodes interface {
	// Cordon taints the Node so that nothing new is scheduled on it; idempotent.
	Cordon(ctx context.Context, node string) error
	// Drain asks the eviction API to evict every pod on the Node that a drain evicts
	// (not DaemonSet pods, not static pods) and returns the pods still there.
	Drain(ctx context.Context, node string) ([]string, error)
	// Uncordon removes Cordon's taint; idempotent.
	Uncordon(ctx context.Context, node string) error
}

// Images checks an image before a rollout to it starts; pxe/httpboot implements it.
type Images interface {
	// VerifyImage returns an error unless the image is in the store and its
	// signature verifies with a trusted key.
	VerifyImage(id string) error
}

// Rollout states. A rollback runs through the Rollback states the same way.
const (
	Running         = "running"
	Paused          = "paused"
	Stopped         = "stopped"
	Done            = "done"
	RollingBack     = "rolling-back"
	RollbackPaused  = "rollback-paused"
	RollbackStopped = "rollback-stopped"
	RolledBack      = "rolled-back"
)

// Machine phases, in order; Failed and Skipped end a machine's step too.
const (
	Pending  = "pending"
	Draining = "draining"
	Cycling  = "cycling"
	Booting  = "booting"
	Ready    = "done"
	Failed   = "failed"
	Skipped  = "skipped"
)

// Rollout is one rollout, as stored.
type Rollout struct {
	ID             string            `json:"id"`
	Image          string            `json:"image"`
	State          string            `json:"state"`
	Reason         string            `json:"reason,omitempty"`
	Actor          string            `json:"actor"`
	Why            string            `json:"why,omitempty"`
	StartedAt      time.Time         `json:"startedAt"`
	EndedAt        time.Time         `json:"endedAt,omitzero"`
	Canary         int               `json:"canary"`
	BatchSize      int               `json:"batchSize"`
	MaxUnavailable int               `json:"maxUnavailable"`
	NodeTimeout    time.Duration     `json:"nodeTimeout"`
	DrainTimeout   time.Duration     `json:"drainTimeout"`
	Match          map[string]string `json:"match,omitempty"`
	Machines       []*Step           `json:"machines"`
	// RollbackPending: a rollback was asked for and the next pass rewrites the
	// steps (applyRollback).
	RollbackPending bool `json:"rollbackPending,omitempty"`
}

// Step is one machine of a rollout.
type Step struct {
	Machine  string `json:"machine"`
	Node     string `json:"node"`
	Batch    int    `json:"batch"`
	Previous string `json:"previous"`
	Target   string `json:"target"`
	Phase    string `json:"phase"`
	// BootID is the bound key's boot id when the step started: the machine has
	// rebooted once its bound key reports another.
	BootID    string    `json:"bootId,omitempty"`
	StartedAt time.Time `json:"startedAt,omitzero"`
	CycledAt  time.Time `json:"cycledAt,omitzero"`
	ReadyAt   time.Time `json:"readyAt,omitzero"`
	Message   string    `json:"message,omitempty"`
}

// Spec is what StartRollout asks for.
type Spec struct {
	Image string
	// Match selects the machines (selector terms), or Machines names them in order.
	Match    map[string]string
	Machines []string
	// Canary machines go first, alone (default 1); then batches of BatchSize (default
	// 1) with at most MaxUnavailable (default BatchSize) unavailable at once.
	Canary, BatchSize, MaxUnavailable int
	// NodeTimeout bounds power cycle to ready (default 20 minutes); DrainTimeout the
	// drain (default 5 minutes).
	NodeTimeout, DrainTimeout time.Duration
	Actor, Reason             string
}

// Defaults for Spec's zero values.
const (
	DefaultNodeTimeout  = 20 * time.Minute
	DefaultDrainTimeout = 5 * time.Minute
)

// Errors a caller maps to its API's codes.
var (
	// ErrInvalid: the request is malformed.
	ErrInvalid = errors.New("invalid rollout request")
	// ErrPrecondition: the state does not allow it (another rollout under way, an
	// image not in the store, a rollout not paused).
	ErrPrecondition = errors.New("rollout precondition failed")
	// ErrNotFound: no such rollout.
	ErrNotFound = errors.New("rollout not found")
)

// active reports whether r still moves machines or may again (paused, stopped).
func (r *Rollout) active() bool {
	switch r.State {
	case Done, RolledBack:
		return false
	}
	return true
}

// rollback reports whether r is in its rollback.
func (r *Rollout) rollback() bool {
	switch r.State {
	case RollingBack, RollbackPaused, RollbackStopped, RolledBack:
		return true
	}
	return false
}

// inFlight reports whether a machine in phase is under way (unavailable).
func inFlight(phase string) bool {
	return phase == Draining || phase == Cycling || phase == Booting
}

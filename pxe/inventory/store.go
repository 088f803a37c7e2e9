package inventory

import (
	"context"
	"errors"

	"github.com/gpurack/gpurack/pxe/identity"
)

// Errors a Store wraps.
var (
	// ErrNotFound: no machine with that id or identity.
	ErrNotFound = errors.New("machine not found")
	// ErrExists: Create for an identity (or id) already recorded.
	ErrExists = errors.New("machine already recorded")
)

// Claim is one claimant of a hardware identity (Store.Claimants).
type Claim struct {
	ID       string
	Identity identity.Identity
}

// Store persists machines and their transitions. Implementations make every call
// atomic: Create and Update write the machine, its identity and node name indexes and
// its transitions in one transaction, or nothing. A Store decides nothing; the lifecycle (Move) and
// pxe/enroll do.
type Store interface {
	// Create records a new machine with its first transition(s). It fails with
	// ErrExists if the identity or the id is already recorded.
	Create(ctx context.Context, m *Machine, ts ...Transition) error
	// Get returns the machine with id, or ErrNotFound.
	Get(ctx context.Context, id string) (*Machine, error)
	// Lookup returns the machine with the identity key (Identity.Key), or ErrNotFound.
	Lookup(ctx context.Context, identityKey string) (*Machine, error)
	// ByNodeName returns the machines whose NodeName is nodeName, ordered by id, from
	// an index (not a scan of every machine). At most one of them is not
	// decommissioned; decommissioned machines keep their name until they boot again.
	ByNodeName(ctx context.Context, nodeName string) ([]*Machine, error)
	// Claimants returns the id and identity of every claimant (Machine.Claimant) whose
	// MAC is mac, or, when mac is empty, whose serial is serial, ordered by id, from an
	// index: the cost is the number of claimants returned, not of machines.
	Claimants(ctx context.Context, mac, serial string) ([]Claim, error)
	// List returns every machine, ordered by id.
	List(ctx context.Context) ([]*Machine, error)
	// Update reads the machine with id, calls fn with a copy, and writes the copy
	// back with the transitions fn returns, atomically. If fn returns an error nothing
	// is written and Update returns it. The identity of a machine never changes.
	// A store shared by several gpuboot replicas (kubestore) calls fn again, on a
	// fresh copy, when another writer changed the machine first: fn changes the copy
	// and nothing else.
	Update(ctx context.Context, id string, fn func(*Machine) ([]Transition, error)) (*Machine, error)
	// History returns the transitions of the machine with id (every machine's when id
	// is empty), oldest first.
	History(ctx context.Context, id string) ([]Transition, error)
	// Close releases the store.
	Close() error
}

// Package inventory is gpuboot's record of machines: who they are (MAC + SMBIOS UUID +
// serial, never the UUID alone), where they stand in the lifecycle, and how they got
// there.
//
// The lifecycle is a pure transition table (state.go): Move checks a move against it
// and returns the Transition to persist, with time, actor and reason; an illegal move
// is an error wrapping ErrIllegalTransition. Record returns the Transition that records
// an action leaving the state as it was (an operator's data-disk wipe and its outcome),
// so the history is the audit record of those too. A Store persists machines and their
// transitions, indexed by identity and by node name; it never decides anything. The
// bbolt store (bolt.go) writes every change in one transaction, so a crash leaves
// either the whole change or none of it. The Store interface is small on purpose, so that a store backed by
// Kubernetes custom resources (several gpuboot replicas across racks) can replace it
// without touching the lifecycle code in pxe/enroll.
//
// It is not the enrollment logic (pxe/enroll decides what a Register or a boot request
// does) and not the operator API (pxe/admin).
package inventory

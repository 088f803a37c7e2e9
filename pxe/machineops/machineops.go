// Package machineops is the contract between gpuboot's operator surface (pxe/admin) and
// the enrollment engine that carries out operators' actions on machines (pxe/enroll):
// the details of an approval and the classes of refusal, which pxe/admin maps to gRPC
// codes (CONTRACTS §4). Neither side imports the other.
//
// It holds no logic.
package machineops

import "errors"

// Classes of refusal of an operator action; wrap them with the reason.
var (
	// ErrPrecondition: the machine's state does not allow the action.
	ErrPrecondition = errors.New("not allowed in the machine's state")
	// ErrInvalid: a malformed or missing argument.
	ErrInvalid = errors.New("invalid argument")
	// ErrAmbiguous: a machine ref matches several machines.
	ErrAmbiguous = errors.New("ambiguous machine reference")
)

// ApproveOptions are an operator's approval details.
type ApproveOptions struct {
	Actor, Reason string
	NodeName      string
	Rack, Slot    string
}

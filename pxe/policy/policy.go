// Package policy decides, without I/O, whether a machine is approved without an
// operator and which image it boots.
//
// Approval modes (issue 4, CONTRACTS §2.4):
//   - manual (the default): only an operator approves;
//   - allowlist: a machine whose serial and/or MAC appear in the rack manifest (CSV, the
//     file a vendor ships with a rack) is approved, and placed at the manifest's rack and
//     slot;
//   - auto: every machine is approved. For labs only: anyone on the provisioning network
//     who claims an identity gets a JoinBundle. gpuboot logs Warning at every start.
//
// Selectors map a machine's labels (rack, sku, slot, an explicit machine) to an image,
// like matchbox groups: the selector with the most matching terms wins.
//
// It is not the lifecycle (pxe/inventory) nor the enrollment flow (pxe/enroll), which
// call it.
package policy

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpurack/gpurack/pxe/identity"
)

// Mode is an approval mode.
type Mode string

// The approval modes.
const (
	Manual    Mode = "manual"
	Allowlist Mode = "allowlist"
	Auto      Mode = "auto"
)

// ParseMode returns the mode named s; "" is Manual.
func ParseMode(s string) (Mode, error) {
	switch Mode(strings.ToLower(strings.TrimSpace(s))) {
	case "", Manual:
		return Manual, nil
	case Allowlist:
		return Allowlist, nil
	case Auto:
		return Auto, nil
	}
	return "", fmt.Errorf("approval mode %q: use manual, allowlist or auto", s)
}

// Decision is the policy's answer for one candidate.
type Decision struct {
	// Approve is true when the policy approves the machine without an operator.
	Approve bool
	// Actor names the rule for the transition record: "policy:allowlist:LINE" (the
	// row's line, when the allowlist is one file), "policy:allowlist:FILE:LINE" (the
	// base name of the row's file too, when it is several) or "policy:auto".
	Actor string
	// Reason is one sentence for the transition record.
	Reason string
	// Rack and Slot are the placement the allowlist gives; empty when it gives none.
	Rack, Slot string
	// BMC is the BMC Redfish address the matched row names; empty when none.
	BMC string
	// Source and Line name the allowlist row the identity matched: its manifest file
	// and line; Line is 0 when none did. One row approves at most one machine:
	// pxe/enroll checks that no other machine holds the row before it acts on an
	// allowlist approval. Several files may have a row on the same line: compare both.
	Source string
	Line   int
	// RowHasMAC is true when the matched row names a MAC (every machine the row
	// matches then has that MAC), false when it names only a serial.
	RowHasMAC bool
	// EKHash is the TPM Endorsement Key the matched row names ("sha256:HEX"); empty
	// when none. With a TPM identity mode only that EK may claim the identity.
	EKHash string
}

// ByAllowlist reports whether the decision approves through an allowlist row.
func (d Decision) ByAllowlist() bool {
	return d.Approve && d.Line > 0 && strings.HasPrefix(d.Actor, "policy:allowlist:")
}

// MatchedRow reports whether e is the allowlist row the decision matched (the same file
// and line).
func (d Decision) MatchedRow(e Entry) bool {
	return d.Line > 0 && d.Line == e.Line && d.Source == e.Source
}

// Policy is an approval mode with its allowlist.
type Policy struct {
	Mode Mode
	// List is the rack manifest; required for Allowlist, optional otherwise (it then
	// only places machines in racks and slots).
	List *List
}

// Warning returns what gpuboot must log at every start for this policy; empty when
// nothing.
func (p Policy) Warning() string {
	if p.Mode == Auto {
		return "approval mode auto: every machine that registers is approved and receives join secrets on the strength of the identity it claims; use it in labs only, never on a shared provisioning network"
	}
	return ""
}

// Validate reports a configuration the policy cannot work with.
func (p Policy) Validate() error {
	if p.Mode == Allowlist && p.List == nil {
		return fmt.Errorf("approval mode allowlist needs an allowlist file (policy.allowlist)")
	}
	return nil
}

// Decide returns the policy's decision for the machine with identity id (normalised,
// as pxe/identity builds it). It is pure.
func (p Policy) Decide(id identity.Identity) Decision {
	var d Decision
	if p.List != nil {
		if e, ok := p.List.Match(id); ok {
			d.Rack, d.Slot, d.Source, d.Line, d.EKHash, d.RowHasMAC, d.BMC = e.Rack, e.Slot, e.Source, e.Line, e.EKHash, e.MAC != "", e.BMC
			if p.Mode == Allowlist {
				d.Approve = true
				d.Actor = fmt.Sprintf("policy:allowlist:%d", e.Line)
				if len(p.List.Sources) > 1 {
					d.Actor = fmt.Sprintf("policy:allowlist:%s:%d", filepath.Base(e.Source), e.Line)
				}
				d.Reason = "listed in the rack manifest " + e.Row()
			}
		}
	}
	if p.Mode == Auto {
		d.Approve = true
		d.Actor = "policy:auto"
		d.Reason = "approval mode auto approves every machine"
	}
	return d
}

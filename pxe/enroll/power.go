package enroll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// BMCAccess is what PowerMachine needs to reach machines' BMCs.
type BMCAccess struct {
	// Credentials are the BMC accounts (bmc-credentials.yaml in gpuboot's state
	// directory); nil when there are none.
	Credentials *bmc.Credentials
	// Unavailable, when set, is why Credentials is nil although the file is there: it
	// failed to load at start (mode, syntax).
	Unavailable error
	// Options bound each power action; zero: pxe/bmc's defaults.
	Options bmc.Options
}

// PowerMachine does action (pxe/bmc: on, off, cycle, status) to the machine ref through
// its BMC (AdminService.PowerMachine). The BMC address is the one the rack manifest's
// row for the machine names now, else the one its record keeps; the account is the
// machine's rack's in BMCAccess.Credentials, else the default. The address is kept on
// the record, and every on, off and cycle is recorded in the machine's history with
// its outcome ("power off", "power off failed"), status not.
//
// A bad action is ErrInvalid; no address, no account, or a power action on the machine
// already under way is ErrPrecondition. The BMC's own errors are pxe/bmc's *bmc.Error
// (bmc.KindOf); the Result says what was sent and answered, with an error too.
func (s *Service) PowerMachine(ctx context.Context, ref string, action bmc.Action, actor, reason string) (*inventory.Machine, bmc.Result, error) {
	if _, err := bmc.ParseAction(string(action)); err != nil {
		return nil, bmc.Result{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	m, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, bmc.Result{}, err
	}
	ep, err := s.bmcEndpoint(m)
	if err != nil {
		return m, bmc.Result{}, err
	}
	if _, busy := s.power.LoadOrStore(m.ID, true); busy {
		return m, bmc.Result{}, fmt.Errorf("%w: a power action on machine %s is under way: wait for it to end (`gpuboot machines history %s` records it)", ErrPrecondition, m.ID, m.ID)
	}
	defer s.power.Delete(m.ID)
	res, powerErr := bmc.Power(ctx, ep, "", action, s.cfg.BMC.Options)
	if action == bmc.ActionStatus && m.BMC == ep.Address {
		return m, res, powerErr
	}
	// Recorded also when the caller gave up: the BMC may have acted.
	now := s.cfg.Now()
	stored, err := s.update(context.WithoutCancel(ctx), m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
		m.BMC = ep.Address
		if action == bmc.ActionStatus {
			return nil, nil
		}
		t, err := inventory.Record(m, powerHistoryAction(action, powerErr), actor, powerHistoryReason(res, powerErr, reason), now)
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
	if err != nil {
		return m, res, errors.Join(powerErr, fmt.Errorf("machine %s: recording the power action in its history: %w", m.ID, err))
	}
	return stored, res, powerErr
}

// bmcEndpoint is the BMC of m with the account for it, or why there is none.
func (s *Service) bmcEndpoint(m *inventory.Machine) (bmc.Endpoint, error) {
	address, manifest := m.BMC, "the rack manifest (policy.allowlist in gpuboot.yaml)"
	if l := s.cfg.Policy.List; l != nil {
		manifest = "the rack manifest " + l.Source
		if e, ok := l.Match(m.Identity); ok {
			manifest = "the rack manifest " + e.Row()
			if e.BMC != "" {
				address = e.BMC
			}
		}
	}
	if address == "" {
		return bmc.Endpoint{}, fmt.Errorf("%w: machine %s has no BMC address: add a bmc column (https://host[:port]) to its row in %s and restart gpuboot", ErrPrecondition, m.ID, manifest)
	}
	if err := s.cfg.BMC.Unavailable; err != nil {
		return bmc.Endpoint{}, fmt.Errorf("%w: gpuboot could not load its BMC credentials at start (%v): fix %s and restart gpuboot", ErrPrecondition, err, bmc.CredentialsFile)
	}
	ep, err := s.cfg.BMC.Credentials.Endpoint(address, m.Rack)
	if err != nil {
		return bmc.Endpoint{}, fmt.Errorf("%w: machine %s: %w", ErrPrecondition, m.ID, err)
	}
	return ep, nil
}

// powerHistoryAction is the history action of a power action: "power off", or "power
// off failed".
func powerHistoryAction(action bmc.Action, err error) string {
	if err != nil {
		return "power " + string(action) + " failed"
	}
	return "power " + string(action)
}

// powerHistoryReason says in one line what the BMC did, and why the operator asked.
func powerHistoryReason(res bmc.Result, err error, reason string) string {
	var what string
	switch {
	case err != nil:
		what = oneLine(err.Error())
	case len(res.Resets) == 0:
		what = fmt.Sprintf("already %s: nothing sent (BMC %s system %s)", res.PowerState, res.Address, res.System)
	default:
		sent := "waited"
		for i, r := range res.Resets {
			if r.ResetType == "" {
				continue
			}
			if i == 0 {
				sent = ""
			} else {
				sent += ", "
			}
			sent += fmt.Sprintf("%s (HTTP %d)", r.ResetType, r.HTTPStatus)
		}
		what = fmt.Sprintf("%s: %s → %s in %s (BMC %s system %s)", sent, res.Before, res.PowerState, res.Elapsed.Round(time.Millisecond), res.Address, res.System)
	}
	if reason = oneLine(reason); reason != "" {
		what += ": " + reason
	}
	return what
}

package bmc

import (
	"fmt"
	"slices"
	"strings"
)

// step is one thing Power does: POST a Reset of resetType (none: only wait) and then
// wait for the PowerState expect.
type step struct {
	resetType string
	expect    PowerState
}

// The ResetTypes Power sends (Redfish Resource.ResetType).
const (
	resetOn         = "On"
	resetForceOn    = "ForceOn"
	resetForceOff   = "ForceOff"
	resetPowerCycle = "PowerCycle"
)

// plan decides the steps that take a system in state now to what action asks for,
// using only the ResetTypes in allowed (the system's ResetType@Redfish.AllowableValues;
// empty means the BMC did not say, and every type is tried as if allowed). No steps
// means there is nothing to do. A ResetType the BMC does not allow is an error that
// lists the ones it does.
func plan(action Action, now PowerState, allowed []string) ([]step, error) {
	switch action {
	case ActionStatus:
		return nil, nil
	case ActionOn:
		switch now {
		case PowerOn:
			return nil, nil
		case "PoweringOn":
			return []step{{expect: PowerOn}}, nil
		}
		return powerOnSteps(allowed)
	case ActionOff:
		switch now {
		case PowerOff:
			return nil, nil
		case "PoweringOff":
			return []step{{expect: PowerOff}}, nil
		}
		if !isAllowed(allowed, resetForceOff) {
			return nil, notAllowed(action, allowed, resetForceOff)
		}
		return []step{{resetType: resetForceOff, expect: PowerOff}}, nil
	case ActionCycle:
		return cycleSteps(now, allowed)
	}
	return nil, errorf(KindInvalid, nil, "unknown power action %q", action)
}

// powerOnSteps sends On, or ForceOn where only that is allowed.
func powerOnSteps(allowed []string) ([]step, error) {
	for _, t := range []string{resetOn, resetForceOn} {
		if isAllowed(allowed, t) {
			return []step{{resetType: t, expect: PowerOn}}, nil
		}
	}
	return nil, notAllowed(ActionOn, allowed, resetOn, resetForceOn)
}

// cycleSteps power-cycles: PowerCycle where allowed, else ForceOff then On. A system
// that is off is only powered on: there is nothing to cycle, and BMCs differ on what
// PowerCycle does to a system that is off.
func cycleSteps(now PowerState, allowed []string) ([]step, error) {
	if now == PowerOff {
		return powerOnSteps(allowed)
	}
	if len(allowed) > 0 && isAllowed(allowed, resetPowerCycle) {
		return []step{{resetType: resetPowerCycle, expect: PowerOn}}, nil
	}
	if !isAllowed(allowed, resetForceOff) {
		return nil, notAllowed(ActionCycle, allowed, resetPowerCycle, resetForceOff)
	}
	on, err := powerOnSteps(allowed)
	if err != nil {
		return nil, notAllowed(ActionCycle, allowed, resetPowerCycle, resetOn, resetForceOn)
	}
	return append([]step{{resetType: resetForceOff, expect: PowerOff}}, on...), nil
}

// isAllowed reports whether t is among allowed, or allowed is empty (not advertised).
func isAllowed(allowed []string, t string) bool {
	return len(allowed) == 0 || slices.Contains(allowed, t)
}

// notAllowed is the error for an action none of whose ResetTypes wanted is allowed.
func notAllowed(action Action, allowed []string, wanted ...string) *Error {
	return errorf(KindUnsupported, nil, "power %s needs ResetType %s, and this system allows only %s (ResetType@Redfish.AllowableValues)",
		action, strings.Join(wanted, " or "), strings.Join(allowed, ", "))
}

// withBMC prefixes err's message with the BMC and system it concerns.
func withBMC(err error, address, system string) error {
	e, ok := err.(*Error)
	if !ok || e.located {
		return err
	}
	return &Error{Kind: e.Kind, Msg: fmt.Sprintf("BMC %s system %s: %s", address, system, e.Msg), Err: e.Err, located: true}
}

package bmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish/schemas"
)

// Status returns the PowerState of the system systemID on the BMC at ep; an empty
// systemID means the only member of /redfish/v1/Systems.
func Status(ctx context.Context, ep Endpoint, systemID string, opts Options) (PowerState, error) {
	res, err := Power(ctx, ep, systemID, ActionStatus, opts)
	return res.PowerState, err
}

// Power does action to the system systemID on the BMC at ep (an empty systemID means
// the only member of /redfish/v1/Systems) and waits until the BMC reports the
// PowerState the action leads to, within opts' timeouts. It sends each Reset once:
// a refused or failed one is returned, not retried. The Result says what was sent and
// what the BMC answered, also alongside an error.
func Power(ctx context.Context, ep Endpoint, systemID string, action Action, opts Options) (res Result, err error) {
	start := time.Now()
	res = Result{Address: ep.Address, System: systemID, Action: action}
	defer func() { res.Elapsed = time.Since(start) }()
	if action, err = ParseAction(string(action)); err != nil {
		return res, errorf(KindInvalid, err, "%v", err)
	}
	res.Action = action
	opts = opts.withDefaults()
	s, err := open(ctx, ep, opts)
	if err != nil {
		return res, err
	}
	res.Address = s.address
	defer func() {
		if err := s.close(); err != nil {
			res.LogoutError = err.Error()
		}
	}()
	sys, err := s.system(systemID)
	if err != nil {
		return res, err
	}
	res.System = sys.ID
	res.Before = PowerState(sys.PowerState)
	res.PowerState = res.Before
	target, allowed, err := s.resetAction(sys)
	if err != nil {
		return res, withBMC(err, s.address, sys.ID)
	}
	steps, err := plan(action, res.Before, allowed)
	if err == nil && target == "" && slices.ContainsFunc(steps, func(st step) bool { return st.resetType != "" }) {
		err = errorf(KindUnsupported, nil, "its ComputerSystem has no #ComputerSystem.Reset action: this BMC offers no power control through Redfish")
	}
	if err != nil {
		return res, withBMC(err, s.address, sys.ID)
	}
	for _, st := range steps {
		r, now, err := s.do(ctx, sys.ODataID, target, st, opts)
		res.Resets = append(res.Resets, r)
		if now != "" {
			res.PowerState = now
		}
		if err != nil {
			return res, withBMC(err, s.address, sys.ID)
		}
	}
	return res, nil
}

// system finds the ComputerSystem id, or the only one when id is empty.
func (s *session) system(id string) (*schemas.ComputerSystem, error) {
	systems, err := s.client.Service.Systems()
	if err != nil {
		return nil, s.explain(err, "listing /redfish/v1/Systems")
	}
	ids := make([]string, 0, len(systems))
	for _, sys := range systems {
		if id != "" && sys.ID == id {
			return sys, nil
		}
		ids = append(ids, sys.ID)
	}
	slices.Sort(ids)
	switch {
	case len(systems) == 0:
		return nil, errorf(KindNotFound, nil, "BMC %s lists no system under /redfish/v1/Systems", s.address)
	case id != "":
		return nil, errorf(KindNotFound, nil, "BMC %s has no system %q; it has %s", s.address, id, strings.Join(ids, ", "))
	case len(systems) > 1:
		return nil, errorf(KindNotFound, nil, "BMC %s has %d systems (%s): name the one to control", s.address, len(systems), strings.Join(ids, ", "))
	}
	return systems[0], nil
}

// resetAction returns the target of sys's #ComputerSystem.Reset action and the
// ResetTypes it allows (from ResetType@Redfish.AllowableValues, or its ActionInfo).
func (s *session) resetAction(sys *schemas.ComputerSystem) (string, []string, error) {
	target, err := parseResetTarget(sys.RawData)
	if err != nil {
		return "", nil, errorf(KindFailed, err, "its ComputerSystem is not valid JSON: %v", err)
	}
	types, err := sys.GetSupportedResetTypes()
	if err != nil {
		return "", nil, s.explain(err, "reading the Reset action's ActionInfo")
	}
	allowed := make([]string, len(types))
	for i, t := range types {
		allowed[i] = string(t)
	}
	return target, allowed, nil
}

// do takes one step: it POSTs the Reset (when the step has one), waits for the Task
// the BMC may answer with, then for the PowerState. It returns what happened and the
// last PowerState read.
func (s *session) do(ctx context.Context, system, target string, st step, opts Options) (r Reset, now PowerState, err error) {
	start := time.Now()
	r = Reset{ResetType: st.resetType, Expect: st.expect}
	defer func() { r.Elapsed = time.Since(start) }()
	if st.resetType != "" {
		status, monitor, err := s.postReset(target, st.resetType)
		r.HTTPStatus = status
		if err != nil {
			return r, "", err
		}
		if monitor != nil {
			r.Task = monitor.TaskMonitor
			if err := s.waitTask(ctx, monitor, &r, opts); err != nil {
				return r, "", err
			}
		}
	}
	now, err = s.waitPower(ctx, system, st.expect, opts)
	r.Reached = err == nil
	return r, now, err
}

// postReset POSTs {"ResetType": resetType} to target, once (DSP0266 "POST (action)").
// It returns the HTTP status and, for 202 Accepted, the task monitor to follow.
func (s *session) postReset(target, resetType string) (int, *schemas.TaskMonitorInfo, error) {
	resp, err := s.client.Post(target, map[string]string{"ResetType": resetType})
	if err != nil {
		var rf *schemas.Error
		status := 0
		if errors.As(err, &rf) {
			status = rf.HTTPReturnedStatusCode
		}
		return status, nil, s.explain(err, "Reset "+resetType)
	}
	defer schemas.DeferredCleanupHTTPResponse(resp)
	if resp.StatusCode != http.StatusAccepted {
		return resp.StatusCode, nil, nil
	}
	monitor := schemas.ParseTaskMonitorInfo(s.client, resp)
	if monitor.TaskMonitor == "" && monitor.Task != nil {
		monitor.TaskMonitor = firstNonEmpty(monitor.Task.TaskMonitor, monitor.Task.ODataID)
	}
	if monitor.TaskMonitor == "" {
		// 202 without a monitor to follow: only the PowerState can tell.
		return resp.StatusCode, nil, nil
	}
	return resp.StatusCode, monitor, nil
}

// waitTask polls the task monitor until the task ends or opts.TaskTimeout passes. A
// task that ends in anything but Completed is an error carrying its messages.
func (s *session) waitTask(ctx context.Context, monitor *schemas.TaskMonitorInfo, r *Reset, opts Options) error {
	deadline := time.Now().Add(opts.TaskTimeout)
	if err := sleepUntil(ctx, monitor.RetryAfter, deadline); err != nil {
		return s.explain(err, "waiting for task "+monitor.TaskMonitor)
	}
	for {
		p, err := s.readTask(monitor.TaskMonitor)
		if err != nil {
			return err
		}
		r.TaskState, r.TaskMessages = p.state, p.messages
		if p.done {
			if p.failed() {
				return errorf(KindFailed, nil, "Reset %s: the BMC's task %s ended %s: %s", r.ResetType, monitor.TaskMonitor, p.state, joinOr(p.messages, "no message"))
			}
			return nil
		}
		if time.Now().Add(opts.PollInterval).After(deadline) {
			return errorf(KindTimeout, nil, "Reset %s: the BMC's task %s is still %s after %s (%s)", r.ResetType, monitor.TaskMonitor, p.state, opts.TaskTimeout, joinOr(p.messages, "no message"))
		}
		if err := sleepUntil(ctx, time.Now().Add(opts.PollInterval), deadline); err != nil {
			return s.explain(err, "waiting for task "+monitor.TaskMonitor)
		}
	}
}

// readTask GETs the task monitor once. A monitor the BMC no longer has (404, 410)
// means the task ended and was removed; the PowerState wait then tells the outcome.
func (s *session) readTask(uri string) (taskProgress, error) {
	resp, err := s.client.Get(uri)
	if err != nil {
		var rf *schemas.Error
		switch {
		case !errors.As(err, &rf), rf.HTTPReturnedStatusCode == http.StatusUnauthorized, rf.HTTPReturnedStatusCode == http.StatusForbidden:
			return taskProgress{}, s.explain(err, "reading task "+uri)
		case rf.HTTPReturnedStatusCode == http.StatusNotFound, rf.HTTPReturnedStatusCode == http.StatusGone:
			return taskProgress{done: true, state: "removed"}, nil
		}
		// The monitor answers with the action's own response once the task ends:
		// an error status is the action's failure.
		return taskProgress{done: true, state: fmt.Sprintf("with HTTP %d", rf.HTTPReturnedStatusCode), messages: []string{redfishMessage(rf)}}, nil
	}
	defer schemas.DeferredCleanupHTTPResponse(resp)
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTaskBody))
	if err != nil {
		return taskProgress{}, s.explain(err, "reading task "+uri)
	}
	return parseTask(resp.StatusCode, body), nil
}

// waitPower reads the system's PowerState until it is want or opts.Timeout passes.
func (s *session) waitPower(ctx context.Context, system string, want PowerState, opts Options) (PowerState, error) {
	deadline := time.Now().Add(opts.Timeout)
	for {
		sys, err := schemas.GetObject[schemas.ComputerSystem](s.client, system)
		if err != nil {
			return "", s.explain(err, "reading "+system)
		}
		now := PowerState(sys.PowerState)
		if now == want {
			return now, nil
		}
		if time.Now().Add(opts.PollInterval).After(deadline) {
			return now, errorf(KindTimeout, nil, "PowerState is still %s after %s waiting for %s: the BMC took the request but the machine did not follow; check the BMC's event log and the machine's power supply", now, opts.Timeout, want)
		}
		if err := sleepUntil(ctx, time.Now().Add(opts.PollInterval), deadline); err != nil {
			return now, s.explain(err, "waiting for PowerState "+string(want))
		}
	}
}

// sleepUntil waits until t (no later than deadline), or until ctx is done.
func sleepUntil(ctx context.Context, t, deadline time.Time) error {
	if t.After(deadline) {
		t = deadline
	}
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func joinOr(ss []string, none string) string {
	if len(ss) == 0 {
		return none
	}
	return strings.Join(ss, "; ")
}

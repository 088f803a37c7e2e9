package rollout

import (
	"fmt"
	"time"
)

// Pause stops starting machines; those under way finish their step.
func (c *Controller) Pause(id, actor, reason string) (*Rollout, error) {
	return c.transition(id, actor, reason, map[string]string{Running: Paused, RollingBack: RollbackPaused}, nil)
}

// Resume starts machines again after a pause or a stop. A machine that failed is
// tried again from the start of its step (the operator has dealt with the cause).
func (c *Controller) Resume(id, actor, reason string) (*Rollout, error) {
	return c.transition(id, actor, reason,
		map[string]string{Paused: Running, Stopped: Running, RollbackPaused: RollingBack, RollbackStopped: RollingBack},
		func(r *Rollout) {
			for _, s := range r.Machines {
				if s.Phase == Failed {
					s.Phase, s.Message = Pending, "failed before ("+s.Message+"); tried again after resume"
					s.StartedAt, s.CycledAt = time.Time{}, time.Time{}
				}
			}
		})
}

// Rollback moves every machine the rollout touched back to the image it had before,
// the same way (drain, power cycle, ready), batch by batch; machines it never touched
// are left alone. The steps are rewritten by the next pass, which is the only writer
// of machines under way.
func (c *Controller) Rollback(id, actor, reason string) (*Rollout, error) {
	return c.transition(id, actor, reason,
		map[string]string{Running: RollingBack, Paused: RollingBack, Stopped: RollingBack, Done: RollingBack},
		func(r *Rollout) { r.EndedAt = time.Time{}; r.RollbackPending = true })
}

// transition moves rollout id by next (from state → to state), applies change, saves
// and wakes Run. Under mu.
func (c *Controller) transition(id, actor, reason string, next map[string]string, change func(*Rollout)) (*Rollout, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, err := c.find(id)
	if err != nil {
		return nil, err
	}
	to, ok := next[r.State]
	if !ok {
		return nil, fmt.Errorf("%w: rollout %s is %s: that does not allow it", ErrPrecondition, r.ID, r.State)
	}
	if reason == "" {
		reason = "no reason given"
	}
	old := r.State
	r.State, r.Reason = to, fmt.Sprintf("%s by %s: %s", to, actor, reason)
	if change != nil {
		change(r)
	}
	if err := c.st.save(r); err != nil {
		return nil, err
	}
	c.cfg.Log.Info("rollout "+to, "rollout", r.ID, "was", old, "actor", actor, "reason", reason)
	c.poke()
	return clone(r), nil
}

// applyRollback rewrites the steps of a rollout whose rollback was asked for: each
// machine the rollout touched goes back to its previous image, from the start of a
// step; the others are skipped. Under mu, at the start of a pass.
func applyRollback(r *Rollout) {
	if !r.RollbackPending {
		return
	}
	r.RollbackPending = false
	for _, s := range r.Machines {
		switch s.Phase {
		case Pending:
			s.Phase, s.Message = Skipped, "not touched by the rollout"
		case Skipped:
		default:
			s.Target, s.Phase, s.Message = s.Previous, Pending, "rolling back from "+s.Phase
			s.StartedAt, s.CycledAt, s.ReadyAt, s.BootID = time.Time{}, time.Time{}, time.Time{}, ""
		}
	}
}

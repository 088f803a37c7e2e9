package rollout

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/inventory"
)

// Run makes a pass over the newest rollout every Interval, and at once after a
// change, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.Pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.wake:
		}
	}
}

// Pass moves the newest rollout on by one step: each machine under way advances
// (drain, power cycle, wait for ready; the machines side by side), then, while the rollout runs, machines of the
// current batch start while fewer than MaxUnavailable are under way. When none is left
// the rollout is done.
func (c *Controller) Pass(ctx context.Context) {
	c.work.Lock()
	defer c.work.Unlock()
	c.mu.Lock()
	r := c.newest()
	if r == nil || !r.active() {
		c.mu.Unlock()
		return
	}
	applyRollback(r)
	var under []int
	for i, s := range r.Machines {
		if inFlight(s.Phase) {
			under = append(under, i)
		}
	}
	c.mu.Unlock()
	// Machines under way advance side by side: a BMC's power cycle or a drain of one
	// does not hold up the others of its batch.
	var wg sync.WaitGroup
	for _, i := range under {
		wg.Go(func() { c.advance(ctx, r, i) })
	}
	wg.Wait()
	c.startNext(ctx, r)
}

// snapshot copies step i of r. Under mu.
func snapshot(r *Rollout, i int) Step { return *r.Machines[i] }

// commit stores s as step i of r and saves r; a failed step stops the rollout.
func (c *Controller) commit(r *Rollout, i int, s Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*r.Machines[i] = s
	if s.Phase == Failed {
		switch r.State {
		case Running, Paused:
			r.State = Stopped
		case RollingBack, RollbackPaused:
			r.State = RollbackStopped
		}
		r.Reason = fmt.Sprintf("machine %s (node %s) failed: %s", s.Machine, s.Node, s.Message)
		c.cfg.Log.Warn("rollout stopped", "rollout", r.ID, "machine", s.Machine, "node", s.Node, "reason", s.Message)
	}
	if err := c.st.save(r); err != nil {
		c.cfg.Log.Error("rollout not saved", "rollout", r.ID, "err", err)
	}
}

// advance moves the machine under way at step i on as far as it goes now.
func (c *Controller) advance(ctx context.Context, r *Rollout, i int) {
	c.mu.Lock()
	s := snapshot(r, i)
	c.mu.Unlock()
	now := c.cfg.Now()
	switch s.Phase {
	case Draining:
		c.drain(ctx, r, &s, now)
	case Cycling:
		actor := "rollout:" + r.ID
		if _, res, err := c.cfg.Machines.PowerMachine(ctx, s.Machine, bmc.ActionCycle, actor, "rolling to image "+s.Target); err != nil {
			s.Phase, s.Message = Failed, fmt.Sprintf("power cycle through the BMC: %v", err)
		} else {
			s.Phase, s.CycledAt = Booting, c.cfg.Now()
			s.Message = fmt.Sprintf("power-cycled (BMC %s: %s); waiting for it to boot image %s and commission", res.Address, res.PowerState, s.Target)
		}
	case Booting:
		c.booting(ctx, r, &s, now)
	}
	c.commit(r, i, s)
}

// drain cordons and drains the machine's Node; it fails after DrainTimeout.
func (c *Controller) drain(ctx context.Context, r *Rollout, s *Step, now time.Time) {
	if s.Node == "" {
		s.Phase, s.Message = Cycling, "no Node to drain"
		return
	}
	if err := c.cfg.Nodes.Cordon(ctx, s.Node); err != nil {
		s.Phase, s.Message = Failed, fmt.Sprintf("cordon node %s: %v", s.Node, err)
		return
	}
	left, err := c.cfg.Nodes.Drain(ctx, s.Node)
	switch {
	case err != nil:
		s.Phase, s.Message = Failed, fmt.Sprintf("drain node %s: %v", s.Node, err)
	case len(left) == 0:
		s.Phase, s.Message = Cycling, "drained"
	case now.Sub(s.StartedAt) > r.DrainTimeout:
		s.Phase, s.Message = Failed, fmt.Sprintf("drain of node %s not done after %s: %d pods left (%s); a PodDisruptionBudget may hold them",
			s.Node, r.DrainTimeout, len(left), strings.Join(first(left, 5), ", "))
	default:
		s.Message = fmt.Sprintf("draining: %d pods left", len(left))
	}
}

// booting checks whether the power-cycled machine is back, ready on its target image.
func (c *Controller) booting(ctx context.Context, r *Rollout, s *Step, now time.Time) {
	m, err := c.cfg.Machines.Resolve(ctx, s.Machine)
	if err != nil {
		s.Message = fmt.Sprintf("reading the machine: %v", err)
		return
	}
	boot := m.BoundBootID()
	rebooted := boot != s.BootID && boot != ""
	switch {
	case rebooted && m.State == inventory.Quarantined:
		s.Phase, s.Message = Failed, fmt.Sprintf("quarantined after booting image %s: its commissioning checklist failed (gpuboot machines show %s)", m.ImageID, s.Machine)
	case rebooted && m.State == inventory.Ready && m.ImageID != s.Target:
		s.Phase, s.Message = Failed, fmt.Sprintf("booted image %s, not %s", m.ImageID, s.Target)
	case rebooted && m.State == inventory.Ready:
		if s.Node != "" {
			if err := c.cfg.Nodes.Uncordon(ctx, s.Node); err != nil {
				s.Message = fmt.Sprintf("ready; uncordon failed, tried again: %v", err)
				return
			}
		}
		s.Phase, s.ReadyAt, s.Message = Ready, c.cfg.Now(), fmt.Sprintf("ready on image %s, uncordoned", s.Target)
	case now.Sub(s.CycledAt) > r.NodeTimeout:
		s.Phase, s.Message = Failed, fmt.Sprintf("not ready on image %s within %s of the power cycle (state %s, rebooted %t)", s.Target, r.NodeTimeout, m.State, rebooted)
	default:
		s.Message = fmt.Sprintf("waiting: state %s, rebooted %t", m.State, rebooted)
	}
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "…")
	}
	return s
}

// startNext starts machines of the current batch (the first with a machine pending or
// under way) while the rollout runs and fewer than MaxUnavailable are under way, and
// ends the rollout when no machine is left.
func (c *Controller) startNext(ctx context.Context, r *Rollout) {
	for {
		c.mu.Lock()
		i, done := nextStart(r)
		if done {
			c.finish(r)
		}
		c.mu.Unlock()
		if i < 0 {
			return
		}
		c.start(ctx, r, i)
	}
}

// nextStart is next after a rollback asked for while this pass advanced machines has
// rewritten the steps (applyRollback): else a pending machine would start toward the
// image being rolled back from. Under mu, with no machine advancing.
func nextStart(r *Rollout) (int, bool) {
	applyRollback(r)
	return next(r)
}

// next is the step to start now, or -1; done when no machine is pending or under way.
// Under mu.
func next(r *Rollout) (int, bool) {
	batch, under := -1, 0
	for _, s := range r.Machines {
		if s.Phase == Pending || inFlight(s.Phase) {
			if batch < 0 || s.Batch < batch {
				batch = s.Batch
			}
		}
		if inFlight(s.Phase) {
			under++
		}
	}
	if batch < 0 {
		return -1, !slices.ContainsFunc(r.Machines, func(s *Step) bool { return s.Phase == Failed })
	}
	if (r.State != Running && r.State != RollingBack) || under >= r.MaxUnavailable {
		return -1, false
	}
	for i, s := range r.Machines {
		if s.Phase == Pending && s.Batch == batch {
			return i, false
		}
	}
	return -1, false
}

// finish ends a rollout with every machine done or skipped. Under mu.
func (c *Controller) finish(r *Rollout) {
	switch r.State {
	case Running:
		r.State, r.Reason = Done, fmt.Sprintf("every machine is ready on image %s; the rollout's pins hold it there", r.Image)
	case RollingBack:
		r.State, r.Reason = RolledBack, "every machine the rollout touched is back on its previous image"
	default:
		return
	}
	r.EndedAt = c.cfg.Now().UTC()
	c.cfg.Log.Info("rollout "+r.State, "rollout", r.ID, "image", r.Image)
	if err := c.st.save(r); err != nil {
		c.cfg.Log.Error("rollout not saved", "rollout", r.ID, "err", err)
	}
}

// start begins step i: pins the machine to its target (a rollback removes the pin, or
// pins the previous image when the selectors would now give another) and marks it
// draining.
func (c *Controller) start(ctx context.Context, r *Rollout, i int) {
	c.mu.Lock()
	s := snapshot(r, i)
	back := r.rollback()
	c.mu.Unlock()
	s.StartedAt, s.Phase = c.cfg.Now(), Draining
	m, err := c.cfg.Machines.Resolve(ctx, s.Machine)
	if err == nil {
		s.BootID = m.BoundBootID()
		actor, why := "rollout:"+r.ID, "rolling to image "+s.Target
		if back {
			why = "rolling back to image " + s.Target
			if m, err = c.cfg.Machines.PinImage(ctx, s.Machine, "", r.ID, actor, why); err == nil && c.cfg.Machines.NextImage(m) != s.Target {
				_, err = c.cfg.Machines.PinImage(ctx, s.Machine, s.Target, r.ID, actor, why)
			}
		} else {
			_, err = c.cfg.Machines.PinImage(ctx, s.Machine, s.Target, r.ID, actor, why)
		}
	}
	if err != nil {
		s.Phase, s.Message = Failed, fmt.Sprintf("pinning image %s: %v", s.Target, err)
	} else {
		s.Message = "pinned; draining"
	}
	c.commit(r, i, s)
}

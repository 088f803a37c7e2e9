package rollout

import (
	"context"
	"fmt"
)

// Released is what Release did to one machine of the rollout.
type Released struct {
	Machine string // inventory id
	Node    string
	Pinned  string // the image the rollout pinned
	// Next is the image the machine boots next now: Pinned while kept, else the one
	// the configuration chooses (a selector or the rack's default).
	Next     string
	Released bool
	Why      string // why it was kept, or what the release changes
}

// Release removes the image pins rollout id left on its machines, once it is done or
// rolled back, so that the configuration (selectors, the rack's default image) decides
// their image again. A machine whose configuration chooses another image than its pin
// keeps the pin, and the answer says which image that is, unless force: then its next
// boot changes image. Machines whose pin another rollout has since replaced, and
// machines without a pin, are left alone. Nothing is rebooted.
func (c *Controller) Release(ctx context.Context, id string, force bool, actor, reason string) (*Rollout, []Released, error) {
	c.mu.Lock()
	r, err := c.find(id)
	if err == nil && r.active() {
		err = fmt.Errorf("%w: rollout %s is %s: release its pins once it is done or rolled back (a stopped rollout: resume or roll it back first)", ErrPrecondition, r.ID, r.State)
	}
	var steps []Step
	if err == nil {
		r = clone(r)
		for _, s := range r.Machines {
			steps = append(steps, *s)
		}
	}
	c.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	if reason == "" {
		reason = "no reason given"
	}
	var out []Released
	for _, s := range steps {
		m, err := c.cfg.Machines.Resolve(ctx, s.Machine)
		if err != nil {
			return r, out, fmt.Errorf("machine %s: %w", s.Machine, err)
		}
		if m.ImagePin == nil || m.ImagePin.Rollout != r.ID {
			continue
		}
		rel := Released{Machine: m.ID, Node: s.Node, Pinned: m.ImagePin.Image}
		unpinned := *m
		unpinned.ImagePin = nil
		next := c.cfg.Machines.NextImage(&unpinned)
		switch {
		case next == rel.Pinned:
			rel.Why = "the configuration chooses the same image"
		case !force:
			rel.Next, rel.Why = rel.Pinned, fmt.Sprintf("kept: the configuration chooses %s; point its selector at %s, or release with force to boot %s next", orNone(next), rel.Pinned, orNone(next))
			out = append(out, rel)
			continue
		default:
			rel.Why = fmt.Sprintf("forced: its next boot is image %s, not %s", orNone(next), rel.Pinned)
		}
		if _, err := c.cfg.Machines.PinImage(ctx, m.ID, "", r.ID, actor, "pin released: "+reason); err != nil {
			return r, out, fmt.Errorf("release the pin of %s: %w", s.Node, err)
		}
		rel.Released, rel.Next = true, next
		c.cfg.Log.Info("rollout pin released", "rollout", r.ID, "machine", m.ID, "node", s.Node, "image", rel.Pinned, "next", next, "actor", actor)
		out = append(out, rel)
	}
	return r, out, nil
}

func orNone(image string) string {
	if image == "" {
		return "no image"
	}
	return image
}

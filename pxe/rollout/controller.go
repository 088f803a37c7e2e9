package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// Config configures a Controller.
type Config struct {
	Machines Machines
	// Nodes drains and cordons; nil: gpuboot has no cluster credential, and
	// StartRollout is refused (a rollout that cannot drain would cut pods off).
	Nodes  Nodes
	Images Images
	// Dir holds the rollout records (STATEDIR/rollouts).
	Dir string
	// Interval between passes over the running rollout (default 5 s).
	Interval time.Duration
	Now      func() time.Time
	Log      *slog.Logger
}

// Controller runs rollouts: one at a time, one pass every Interval (Run).
type Controller struct {
	cfg Config
	st  store
	// mu guards rollouts and every Rollout and Step in it; work serialises passes
	// (the only writer of machines under way).
	mu       sync.Mutex
	work     sync.Mutex
	rollouts []*Rollout
	wake     chan struct{}
}

// New loads the rollouts in cfg.Dir.
func New(cfg Config) (*Controller, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c := &Controller{cfg: cfg, st: store{dir: cfg.Dir}, wake: make(chan struct{}, 1)}
	rs, err := c.st.load()
	if err != nil {
		return nil, err
	}
	c.rollouts = rs
	return c, nil
}

// Start checks spec and the image and starts a rollout (AdminService.StartRollout).
func (c *Controller) Start(ctx context.Context, spec Spec) (*Rollout, error) {
	spec, err := normalise(spec)
	if err != nil {
		return nil, err
	}
	if c.cfg.Nodes == nil {
		return nil, fmt.Errorf("%w: gpuboot has no cluster credential (cluster.kubeconfig in gpuboot.yaml), and a rollout must drain each node before it power-cycles it", ErrPrecondition)
	}
	// Verified before the lock: a first verification reads and copies the whole image.
	if err := c.cfg.Images.VerifyImage(spec.Image); err != nil {
		return nil, fmt.Errorf("%w: image %s cannot be served, so no machine is touched: %v", ErrPrecondition, spec.Image, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.newest(); r != nil && r.active() {
		return nil, fmt.Errorf("%w: rollout %s is %s (%s): resume it, roll it back or let it finish first (gpuboot rollout status %s)", ErrPrecondition, r.ID, r.State, r.Image, r.ID)
	}
	now := c.cfg.Now().UTC()
	r := &Rollout{ID: c.newID(now), Image: spec.Image, State: Running, Actor: spec.Actor, Why: spec.Reason, StartedAt: now,
		Canary: spec.Canary, BatchSize: spec.BatchSize, MaxUnavailable: spec.MaxUnavailable,
		NodeTimeout: spec.NodeTimeout, DrainTimeout: spec.DrainTimeout, Match: spec.Match}
	if r.Machines, err = c.chooseMachines(ctx, spec); err != nil {
		return nil, err
	}
	if err := c.st.save(r); err != nil {
		return nil, err
	}
	c.rollouts = append(c.rollouts, r)
	c.cfg.Log.Info("rollout started", "rollout", r.ID, "image", r.Image, "machines", len(r.Machines), "actor", r.Actor)
	c.poke()
	return clone(r), nil
}

// normalise checks spec and fills its defaults.
func normalise(spec Spec) (Spec, error) {
	bad := func(format string, a ...any) (Spec, error) {
		return spec, fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	switch {
	case !policy.IsImageID(spec.Image):
		return bad("image %q is not an image id (40 lowercase hex characters, CONTRACTS §7)", spec.Image)
	case len(spec.Match) == 0 && len(spec.Machines) == 0:
		return bad("name the machines: a selector (--selector rack=r1) or machine names")
	case len(spec.Match) > 0 && len(spec.Machines) > 0:
		return bad("give a selector or machine names, not both")
	case spec.Canary < 0 || spec.BatchSize < 0 || spec.MaxUnavailable < 0 || spec.NodeTimeout < 0 || spec.DrainTimeout < 0:
		return bad("canary, batch size, max unavailable and timeouts cannot be negative")
	case spec.Actor == "":
		return bad("no actor")
	}
	if spec.Canary == 0 {
		spec.Canary = 1
	}
	if spec.BatchSize == 0 {
		spec.BatchSize = 1
	}
	if spec.MaxUnavailable == 0 {
		spec.MaxUnavailable = spec.BatchSize
	}
	if spec.NodeTimeout == 0 {
		spec.NodeTimeout = DefaultNodeTimeout
	}
	if spec.DrainTimeout == 0 {
		spec.DrainTimeout = DefaultDrainTimeout
	}
	return spec, nil
}

// chooseMachines resolves the rollout's machines in order and puts them in batches.
// Every machine must be ready; machines already on the image are skipped.
func (c *Controller) chooseMachines(ctx context.Context, spec Spec) ([]*Step, error) {
	var ms []*inventory.Machine
	if len(spec.Machines) > 0 {
		for _, ref := range spec.Machines {
			m, err := c.cfg.Machines.Resolve(ctx, ref)
			if err != nil {
				return nil, fmt.Errorf("%w: machine %q: %v", ErrPrecondition, ref, err)
			}
			if m.State != inventory.Ready {
				return nil, fmt.Errorf("%w: machine %s is %s, not ready: a rollout moves ready machines only", ErrPrecondition, ref, m.State)
			}
			if slices.ContainsFunc(ms, func(o *inventory.Machine) bool { return o.ID == m.ID }) {
				return nil, fmt.Errorf("%w: machine %s is named twice", ErrInvalid, ref)
			}
			ms = append(ms, m)
		}
	} else {
		all, err := c.cfg.Machines.List(ctx)
		if err != nil {
			return nil, err
		}
		sel := []policy.Selector{{Name: "rollout", Match: spec.Match}}
		for _, m := range all {
			if _, ok := policy.Select(sel, c.cfg.Machines.SelectorLabels(m)); ok && m.State == inventory.Ready {
				ms = append(ms, m)
			}
		}
		sort.SliceStable(ms, func(i, j int) bool { return ms[i].NodeName < ms[j].NodeName })
		if len(ms) == 0 {
			return nil, fmt.Errorf("%w: no ready machine matches %v", ErrPrecondition, spec.Match)
		}
	}
	var steps []*Step
	n := 0
	for _, m := range ms {
		st := &Step{Machine: m.ID, Node: m.NodeName, Previous: c.cfg.Machines.NextImage(m), Target: spec.Image, Phase: Pending}
		if st.Previous == spec.Image && m.ImageID == spec.Image {
			st.Phase, st.Message = Skipped, "already on the image"
		} else {
			st.Batch = batchOf(n, spec.Canary, spec.BatchSize)
			n++
		}
		steps = append(steps, st)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: every machine chosen is already on image %s", ErrPrecondition, spec.Image)
	}
	return steps, nil
}

// batchOf is the batch of the nth machine to move: 0 for the canary, then 1, 2, ….
func batchOf(n, canary, size int) int {
	if n < canary {
		return 0
	}
	return 1 + (n-canary)/size
}

// newID is "r" and now to the second, suffixed if taken. Under mu.
func (c *Controller) newID(now time.Time) string {
	base := "r" + now.Format("20060102T150405Z")
	id := base
	for i := 2; slices.ContainsFunc(c.rollouts, func(r *Rollout) bool { return r.ID == id }); i++ {
		id = fmt.Sprintf("%s-%d", base, i)
	}
	return id
}

// newest is the latest rollout, or nil. Under mu.
func (c *Controller) newest() *Rollout {
	if len(c.rollouts) == 0 {
		return nil
	}
	return c.rollouts[len(c.rollouts)-1]
}

// find is the rollout id, the newest for "". Under mu.
func (c *Controller) find(id string) (*Rollout, error) {
	if id == "" {
		if r := c.newest(); r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("%w: no rollout has been started", ErrNotFound)
	}
	for _, r := range c.rollouts {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: no rollout %q", ErrNotFound, id)
}

// Get returns a copy of the rollout id (the newest for "").
func (c *Controller) Get(id string) (*Rollout, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, err := c.find(id)
	if err != nil {
		return nil, err
	}
	return clone(r), nil
}

// clone deep-copies r.
func clone(r *Rollout) *Rollout {
	out := *r
	out.Machines = make([]*Step, len(r.Machines))
	for i, s := range r.Machines {
		cp := *s
		out.Machines[i] = &cp
	}
	return &out
}

// poke wakes Run for a pass now.
func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

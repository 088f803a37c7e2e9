package server

import (
	"context"
	"path/filepath"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/rollout"
)

// startRollouts loads the rollouts in STATEDIR/rollouts and runs the newest on
// (pxe/rollout). Without a cluster credential StartRollout is refused: a rollout
// drains every node before it power-cycles it.
func (g *gpuboot) startRollouts(ctx context.Context) (started, error) {
	cfg := rollout.Config{Machines: g.enroll, Images: g.boot, Dir: filepath.Join(g.cfg.StateDir, "rollouts"), Log: g.log.With("service", "rollout")}
	if g.cluster != nil {
		cfg.Nodes = g.cluster
	}
	var err error
	if g.rollouts, err = rollout.New(cfg); err != nil {
		return started{}, err
	}
	return started{loops: []loop{{name: "rollouts", run: func() error { return g.rollouts.Run(ctx) }}}}, nil
}

// nextImage is AdminService's Machine.next_image: the image m gets at its next boot
// and why.
func (g *gpuboot) nextImage(m *inventory.Machine) *bootv1.ImageChoice {
	c := g.enroll.ImageChoice(m)
	return &bootv1.ImageChoice{ImageId: c.Image, Source: c.Source, Name: c.Name, Reason: c.Why, Lost: c.Lost}
}

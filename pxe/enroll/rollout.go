package enroll

import (
	"context"
	"fmt"

	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// What the enrollment service does for pxe/rollout (rollout.Machines).

// List returns every machine in the inventory.
func (s *Service) List(ctx context.Context) ([]*inventory.Machine, error) { return s.store.List(ctx) }

// SelectorLabels are the labels selectors' match terms see for m (Labels).
func (s *Service) SelectorLabels(m *inventory.Machine) policy.Labels { return Labels(m) }

// NextImage is the image m gets at its next boot (ImageChoice).
func (s *Service) NextImage(m *inventory.Machine) string { return s.ImageChoice(m).Image }

// PinImage pins the machine with id to image for a rollout, or removes its pin when
// image is empty, and records that in its history ("image pinned", "image unpinned").
// A pin wins over every selector (decision 0687); the machine boots the image at its
// next boot.
func (s *Service) PinImage(ctx context.Context, id, image, rollout, actor, reason string) (*inventory.Machine, error) {
	now := s.cfg.Now()
	return s.update(ctx, id, func(m *inventory.Machine) ([]inventory.Transition, error) {
		action := "image pinned"
		switch {
		case image == "" && m.ImagePin == nil:
			return nil, nil
		case image == "":
			action, m.ImagePin = "image unpinned", nil
			reason = fmt.Sprintf("%s (rollout %s)", reason, rollout)
		default:
			if m.ImagePin != nil && m.ImagePin.Image == image && m.ImagePin.Rollout == rollout {
				return nil, nil
			}
			m.ImagePin = &inventory.ImagePin{Image: image, Rollout: rollout, Since: now}
			reason = fmt.Sprintf("%s: image %s (rollout %s)", reason, image, rollout)
		}
		t, err := inventory.Record(m, action, actor, reason, now)
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
}

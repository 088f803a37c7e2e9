package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// MigrateReport is what Migrate did.
type MigrateReport struct {
	// Machines in the source; Copied of them were written to the destination and
	// AlreadyThere were found there identical (a migration run again).
	Machines, Copied, AlreadyThere int
	// Transitions copied with them, in all.
	Transitions int
}

// Migrate copies every machine of src, with its whole history, into dst, and then
// reads each back from dst and compares it, record and history, with src's. A machine
// dst already holds identically is left as it is, so a migration stopped half-way can
// be run again; one dst holds differently stops the migration, naming it, with nothing
// of it overwritten. progress, when not nil, hears of each machine done. src is only
// read.
func Migrate(ctx context.Context, src, dst Store, progress func(done, total int, m *Machine)) (MigrateReport, error) {
	all, err := src.List(ctx)
	if err != nil {
		return MigrateReport{}, fmt.Errorf("read the source inventory: %w", err)
	}
	rep := MigrateReport{Machines: len(all)}
	for i, m := range all {
		hist, err := src.History(ctx, m.ID)
		if err != nil {
			return rep, fmt.Errorf("read the history of machine %s: %w", m.ID, err)
		}
		if err := CheckHistory(hist, m.State); err != nil {
			return rep, fmt.Errorf("machine %s (%s): its history in the source does not check, so it is not copied: %w", m.ID, m.Identity.Key(), err)
		}
		err = dst.Create(ctx, m, hist...)
		switch {
		case errors.Is(err, ErrExists):
			if err := same(ctx, dst, m, hist); err != nil {
				return rep, fmt.Errorf("machine %s (%s) is already in the destination, and differs: %w; nothing of it was overwritten", m.ID, m.Identity.Key(), err)
			}
			rep.AlreadyThere++
		case err != nil:
			return rep, fmt.Errorf("copy machine %s: %w", m.ID, err)
		default:
			rep.Copied++
			rep.Transitions += len(hist)
		}
		if progress != nil {
			progress(i+1, len(all), m)
		}
	}
	for _, m := range all {
		hist, err := src.History(ctx, m.ID)
		if err != nil {
			return rep, err
		}
		if err := same(ctx, dst, m, hist); err != nil {
			return rep, fmt.Errorf("check machine %s after the copy: %w", m.ID, err)
		}
	}
	n, err := dst.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("check the destination: %w", err)
	}
	if len(n) < len(all) {
		return rep, fmt.Errorf("check the destination: it lists %d machines, the source %d", len(n), len(all))
	}
	return rep, nil
}

// same reports how dst's machine differs from m with history hist; nil when it does not.
func same(ctx context.Context, dst Store, m *Machine, hist []Transition) error {
	got, err := dst.Lookup(ctx, m.Identity.Key())
	if err != nil {
		return err
	}
	a, _ := json.Marshal(m)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		return fmt.Errorf("the record differs (id %s there)", got.ID)
	}
	gotHist, err := dst.History(ctx, got.ID)
	if err != nil {
		return err
	}
	if !slices.EqualFunc(hist, gotHist, func(x, y Transition) bool {
		jx, _ := json.Marshal(x)
		jy, _ := json.Marshal(y)
		return string(jx) == string(jy)
	}) {
		return fmt.Errorf("the history differs: %d transitions there, %d here", len(gotHist), len(hist))
	}
	return nil
}

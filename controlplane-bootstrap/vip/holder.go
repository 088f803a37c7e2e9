package vip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// errSessionLost ends a term whose etcd session's lease stopped being kept alive.
var errSessionLost = errors.New("the etcd session was lost (etcd unreachable for the TTL, or the lease expired)")

// errNotLeader ends a term whose election key was deleted while this host held the address.
var errNotLeader = errors.New("no longer the leader: this host's election key was deleted")

// holder is one Run: its configuration, etcd client and logger.
type holder struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger
}

// loop runs terms, one etcd session each, until ctx ends. Between terms it waits,
// longer after each term that ended soon after it began, up to maxBackoff.
func (h *holder) loop(ctx context.Context) {
	backoff := minBackoff
	for ctx.Err() == nil {
		began := time.Now()
		err := h.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 2*maxBackoff {
			backoff = minBackoff
		}
		h.log.Warn("campaigning again with a new etcd session", "after", backoff, "why", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// term runs one etcd session: it campaigns, holds the address while it is the
// leader, and ends the session. It returns why the term ended, or nil if ctx ended.
func (h *holder) term(ctx context.Context) error {
	s, err := h.newSession(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("open an etcd session: %w", err)
	}
	e := concurrency.NewElection(s, electionPrefix(h.cfg.Address))
	began := time.Now()
	won, why := campaign(ctx, s, e, h.cfg.Name)
	if won {
		why = h.hold(ctx, s, e, time.Since(began))
	}
	h.endSession(s, e, won)
	if ctx.Err() != nil {
		return nil
	}
	return why
}

// newSession grants a lease of the configured TTL, waiting at most grantTimeout for
// etcd, and keeps it alive in a session. The lease's keep-alive does not end with
// ctx: endSession ends it.
func (h *holder) newSession(ctx context.Context) (*concurrency.Session, error) {
	ttl := int64(h.cfg.TTL / time.Second)
	gctx, cancel := context.WithTimeout(ctx, grantTimeout)
	defer cancel()
	lease, err := h.cli.Grant(gctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("grant a %ds lease: %w", ttl, err)
	}
	s, err := concurrency.NewSession(h.cli, concurrency.WithTTL(int(ttl)), concurrency.WithLease(lease.ID))
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		h.cli.Revoke(rctx, lease.ID)
		return nil, fmt.Errorf("keep lease %x alive: %w", lease.ID, err)
	}
	return s, nil
}

// campaign waits until this host wins election e, ctx ends or session s is lost. It
// runs e.Campaign on its own goroutine, because a cancelled Campaign resigns without
// a time limit; when campaign gives up waiting, that goroutine may still be running,
// so the caller must not use e again (revoking s's lease deletes its key).
func campaign(ctx context.Context, s *concurrency.Session, e *concurrency.Election, name string) (won bool, why error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.Ctx(), cancel)()
	done := make(chan error, 1)
	go func() { done <- e.Campaign(cctx, name) }()
	select {
	case err := <-done:
		if err == nil {
			return true, nil
		}
		if ctx.Err() == nil && s.Ctx().Err() == nil {
			return false, fmt.Errorf("campaign: %w", err)
		}
	case <-cctx.Done():
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return false, errSessionLost
}

// hold adds the address and keeps it until ctx ends, session s is lost or this
// host's key in election e is deleted; then it deletes the address and returns why.
func (h *holder) hold(ctx context.Context, s *concurrency.Session, e *concurrency.Election, after time.Duration) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// From the revision after the key's creation: a deletion that already happened
	// is replayed.
	watch := h.cli.Watch(wctx, e.Key(), clientv3.WithRev(e.Rev()+1))
	var why error
	select {
	case <-s.Done():
		return errSessionLost // won with a lease that has just been lost: never took it
	default:
	}
	if err := h.addAddress(); err != nil {
		why = fmt.Errorf("adding it failed: %w", err)
	} else {
		h.log.Info("took the API address", "took_after", after.Round(time.Millisecond), "name", h.cfg.Name)
		why = h.keep(ctx, s, watch)
	}
	if _, err := h.deleteAddress(); err != nil {
		h.log.Error("could not delete the API address", "err", err)
	}
	h.log.Info("released the API address", "why", why.Error())
	return why
}

// keep sends gratuitous ARPs (announceCount one announceFirstInterval apart, then one
// every announceInterval) until ctx ends, s is lost or watch reports that this host
// is no longer the leader, and returns which.
func (h *holder) keep(ctx context.Context, s *concurrency.Session, watch clientv3.WatchChan) error {
	sent := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopping (%w)", context.Cause(ctx))
		case <-s.Done():
			return errSessionLost
		case wr, ok := <-watch:
			if ctx.Err() != nil {
				return fmt.Errorf("stopping (%w)", context.Cause(ctx))
			}
			if err := leadershipEnded(wr, ok); err != nil {
				return err
			}
		case <-timer.C:
			if err := h.announce(); err != nil {
				h.log.Warn("could not send a gratuitous ARP", "err", err)
			}
			sent++
			if sent < announceCount {
				timer.Reset(announceFirstInterval)
			} else {
				timer.Reset(announceInterval)
			}
		}
	}
}

// leadershipEnded returns why a watch response on this host's election key ends
// its leadership, or nil if it does not. The watch ending counts: without it a
// deletion would go unseen.
func leadershipEnded(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("the watch on this host's election key ended")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("the watch on this host's election key failed: %w", err)
	}
	for _, ev := range wr.Events {
		if ev.Type == clientv3.EventTypeDelete {
			return errNotLeader
		}
	}
	return nil
}

// endSession resigns from e if this host won it, stops keeping s's lease alive and
// revokes the lease, which deletes this host's election key. Each call to etcd gets
// cleanupTimeout, whatever the state of the term's context. A lost session does not
// resign: etcd is likely unreachable, and the revocation deletes the key as well.
func (h *holder) endSession(s *concurrency.Session, e *concurrency.Election, won bool) {
	lost := s.Ctx().Err() != nil // before Orphan, which cancels it
	if won && !lost {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		if err := e.Resign(ctx); err != nil {
			h.log.Warn("could not resign from the election; the lease's revocation or expiry ends it", "err", err)
		}
		cancel()
	}
	s.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if _, err := h.cli.Revoke(ctx, s.Lease()); err != nil {
		level := slog.LevelWarn
		if lost {
			level = slog.LevelDebug // expected: the lease has expired or etcd is unreachable
		}
		h.log.Log(context.Background(), level, "could not revoke the etcd lease; it expires after the TTL", "lease", fmt.Sprintf("%x", s.Lease()), "err", err)
	}
}

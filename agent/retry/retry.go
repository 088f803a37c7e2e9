// Package retry runs one attempt after another until one succeeds or the context ends,
// waiting between failures with capped exponential backoff: the one backoff loop of the
// agent's node (agent/node: the Kubernetes join, starting kubelet, the commissioning
// report, the post-join services' restarts).
//
// It decides nothing about what a failure means to an operator: the caller's onFail
// logs it, sets a status or writes the console. It is not for polling with a deadline,
// and it adds no jitter (gpuboot's enrollment client, agent/enroll, has its own, with
// gpuboot's retry_after).
package retry

import (
	"context"
	"errors"
	"time"
)

// Backoff is how long to wait after each failed attempt: First after the first,
// doubling up to Max. Max below First means First every time.
type Backoff struct {
	First, Max time.Duration
	// Sleep waits d, returning false if ctx ended first; nil: a timer. Tests set it.
	Sleep func(ctx context.Context, d time.Duration) bool
}

// Delay is the wait after the n-th failed attempt (n from 1).
func (b Backoff) Delay(n int) time.Duration {
	d := b.First
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	return max(b.First, min(d, b.Max))
}

// Failure is one failed attempt, for the caller's report.
type Failure struct {
	// Attempt counts the attempts so far, from 1.
	Attempt int
	Err     error
	// Wait is how long Do waits before the next attempt.
	Wait time.Duration
}

// Do calls attempt until it returns nil (Do returns nil) or ctx ends (Do returns ctx's
// error). After each failure it calls onFail, when not nil, and waits the backoff's
// delay. An attempt that fails because ctx ended is not reported. An error wrapped
// by Permanent ends Do at once with that error; one wrapped by Now is tried again at
// once, unreported (the delay after the next failure is still the next one in line).
func (b Backoff) Do(ctx context.Context, attempt func(context.Context) error, onFail func(Failure)) error {
	sleep := b.Sleep
	if sleep == nil {
		sleep = timer
	}
	for n := 1; ; n++ {
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var p *permanent
		if errors.As(err, &p) {
			return p.err
		}
		if errors.Is(err, errNow) {
			continue
		}
		wait := b.Delay(n)
		if onFail != nil {
			onFail(Failure{Attempt: n, Err: err, Wait: wait})
		}
		if !sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// Permanent marks err as one that trying again will not fix: Do returns err itself.
func Permanent(err error) error { return &permanent{err} }

type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }
func (p *permanent) Unwrap() error { return p.err }

// Now is the error an attempt returns to be tried again at once (it changed what the
// next attempt does, such as forgetting credentials the server refused).
func Now() error { return errNow }

var errNow = errors.New("retry now")

func timer(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

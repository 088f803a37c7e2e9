package retry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		b    Backoff
		want []time.Duration // for n = 1, 2, …
	}{
		{Backoff{First: time.Second, Max: 30 * time.Second},
			[]time.Duration{1, 2, 4, 8, 16, 30, 30}},
		{Backoff{First: 5 * time.Second, Max: time.Minute},
			[]time.Duration{5, 10, 20, 40, 60, 60}},
		{Backoff{First: time.Second, Max: time.Second}, []time.Duration{1, 1, 1}},
		{Backoff{First: 2 * time.Second}, []time.Duration{2, 2}}, // Max below First
	} {
		for i, w := range tc.want {
			if got := tc.b.Delay(i + 1); got != w*time.Second {
				t.Errorf("%+v: Delay(%d) = %v, want %v", tc.b, i+1, got, w*time.Second)
			}
		}
	}
}

// script is an attempt that returns its errors in turn, then nil; cancel, when set,
// ends the context at that attempt (from 1).
type script struct {
	errs   []error
	cancel int
}

var errDown = errors.New("apiserver not answering")

func TestDo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		s        script
		attempts int
		waits    []time.Duration // what Do slept, in seconds
		reported []int           // the attempts onFail saw
		err      error
	}{
		{name: "first attempt succeeds", attempts: 1},
		{name: "two failures then success", s: script{errs: []error{errDown, errDown}},
			attempts: 3, waits: []time.Duration{1, 2}, reported: []int{1, 2}},
		{name: "backoff capped", s: script{errs: []error{errDown, errDown, errDown, errDown, errDown}},
			attempts: 6, waits: []time.Duration{1, 2, 4, 4, 4}, reported: []int{1, 2, 3, 4, 5}},
		{name: "permanent ends at once", s: script{errs: []error{errDown, Permanent(errDown)}},
			attempts: 2, waits: []time.Duration{1}, reported: []int{1}, err: errDown},
		{name: "now retries without a wait or report", s: script{errs: []error{errDown, Now(), errDown}},
			attempts: 4, waits: []time.Duration{1, 4}, reported: []int{1, 3}},
		{name: "context ends during an attempt: not reported", s: script{errs: []error{errDown, errDown}, cancel: 2},
			attempts: 2, waits: []time.Duration{1}, reported: []int{1}, err: context.Canceled},
		{name: "context ends during a wait", s: script{errs: []error{errDown, errDown, errDown}, cancel: -2},
			attempts: 2, waits: []time.Duration{1, 2}, reported: []int{1, 2}, err: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var waits []time.Duration
			b := Backoff{First: time.Second, Max: 4 * time.Second, Sleep: func(ctx context.Context, d time.Duration) bool {
				waits = append(waits, d/time.Second)
				if tc.s.cancel < 0 && len(waits) == -tc.s.cancel {
					cancel()
				}
				return ctx.Err() == nil
			}}
			attempts := 0
			var reported []int
			err := b.Do(ctx, func(context.Context) error {
				attempts++
				if attempts == tc.s.cancel {
					cancel()
				}
				if attempts > len(tc.s.errs) {
					return nil
				}
				return tc.s.errs[attempts-1]
			}, func(f Failure) {
				if f.Wait != b.Delay(f.Attempt) || !errors.Is(f.Err, errDown) {
					t.Errorf("onFail(%+v)", f)
				}
				reported = append(reported, f.Attempt)
			})
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Do = %v, want %v", err, tc.err)
			}
			if attempts != tc.attempts || !slices.Equal(waits, tc.waits) || !slices.Equal(reported, tc.reported) {
				t.Errorf("attempts %d waits %v reported %v; want %d %v %v", attempts, waits, reported, tc.attempts, tc.waits, tc.reported)
			}
		})
	}
}

// A Permanent error is still the error it wraps, for errors.Is and its text.
func TestPermanentWraps(t *testing.T) {
	err := Permanent(fmt.Errorf("nftables: %w", errDown))
	if !errors.Is(err, errDown) || err.Error() != "nftables: "+errDown.Error() {
		t.Errorf("Permanent: %v", err)
	}
}

// The real timer waits, and gives up when the context ends.
func TestTimer(t *testing.T) {
	if !timer(context.Background(), time.Millisecond) {
		t.Error("timer with a live context returned false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if timer(ctx, time.Hour) {
		t.Error("timer with an ended context returned true")
	}
}

package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// A service is one named part of `gpuboot serve`. start builds it from what the
// services before it provide and returns its loops; needs and provides name those
// things, so that the start order can be read (and is checked by a test) from the
// list in services.go.
type service struct {
	name     string
	needs    []string
	provides []string
	start    func(ctx context.Context) (started, error)
}

// started is what a service's start returns: the loops to run, and what to release
// once every loop of every service has returned (nil: nothing).
type started struct {
	loops   []loop
	release func()
}

// A loop serves until ctx ends, stop is called or it fails.
type loop struct {
	name string
	run  func() error
	// stop makes run return, within the shutdown context's time; nil: run returns when
	// the supervisor's context ends.
	stop func(shutdown context.Context)
}

// shutdownGrace is how long the loops get to finish what they serve at shutdown.
const shutdownGrace = 5 * time.Second

// supervise starts services in order and runs their loops until ctx ends or a loop
// fails, then stops the loops in the reverse order, waits for them and releases the
// services, also in reverse. A service that fails to start stops the ones before it
// the same way; its error is returned as it is (each names what failed), a loop's
// error with the loop's name. ready runs once every service has started.
func supervise(ctx context.Context, log *slog.Logger, services []service, ready func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	var running []started
	defer func() {
		cancel()
		shutdown, stop := context.WithTimeout(context.Background(), shutdownGrace)
		defer stop()
		for i := len(running) - 1; i >= 0; i-- {
			for _, l := range running[i].loops {
				if l.stop != nil {
					l.stop(shutdown)
				}
			}
		}
		wg.Wait()
		for i := len(running) - 1; i >= 0; i-- {
			if running[i].release != nil {
				running[i].release()
			}
		}
	}()
	for _, s := range services {
		st, err := s.start(ctx)
		if err != nil {
			return err
		}
		running = append(running, st)
		for _, l := range st.loops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.run(); err != nil && ctx.Err() == nil {
					select {
					case errc <- fmt.Errorf("%s: %w", l.name, err):
					default:
					}
				}
			}()
		}
		log.Debug("service started", "service", s.name, "provides", s.provides)
	}
	if ready != nil {
		ready()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

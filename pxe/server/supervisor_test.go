package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/gpurack/gpurack/pxe/config"
)

// TestServicesStartAfterWhatTheyNeed: in services' order, everything a service needs
// is provided by one started before it, and nothing is provided twice.
func TestServicesStartAfterWhatTheyNeed(t *testing.T) {
	g := &gpuboot{cfg: &config.Config{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	provided := map[string]string{}
	names := map[string]bool{}
	for _, s := range g.services() {
		if s.name == "" || names[s.name] || s.start == nil {
			t.Errorf("service %q: a unique name and a start are required", s.name)
		}
		names[s.name] = true
		for _, n := range s.needs {
			if _, ok := provided[n]; !ok {
				t.Errorf("service %q needs %q, which no service before it provides", s.name, n)
			}
		}
		for _, p := range s.provides {
			if by, dup := provided[p]; dup {
				t.Errorf("%q is provided by both %q and %q", p, by, s.name)
			}
			provided[p] = s.name
		}
	}
}

// TestSuperviseStopsInReverseOrder: a loop's failure ends supervise with the loop's
// name; every loop is stopped, latest service first, and the services are released
// after all loops returned, also latest first. A service that fails to start stops
// those before it and is not itself run or released.
func TestSuperviseStopsInReverseOrder(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var events []string
	record := func(e string) { events = append(events, e) }
	blocking := func(name string) service {
		return service{name: name, start: func(ctx context.Context) (started, error) {
			done := make(chan struct{})
			return started{
				loops: []loop{{name: name, run: func() error { <-done; return nil },
					stop: func(context.Context) { record("stop " + name); close(done) }}},
				release: func() { record("release " + name) },
			}, nil
		}}
	}
	failing := service{name: "c", start: func(ctx context.Context) (started, error) {
		return started{loops: []loop{{name: "c", run: func() error { return errors.New("socket closed") }}}}, nil
	}}
	err := supervise(context.Background(), log, []service{blocking("a"), blocking("b"), failing}, func() { record("ready") })
	if err == nil || err.Error() != "c: socket closed" {
		t.Errorf("supervise: %v, want the loop's error with its name", err)
	}
	want := []string{"ready", "stop b", "stop a", "release b", "release a"}
	if !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}

	events = nil
	refused := service{name: "d", start: func(context.Context) (started, error) { return started{}, errors.New("listen.tls: address in use") }}
	err = supervise(context.Background(), log, []service{blocking("a"), refused, blocking("e")}, func() { record("ready") })
	if err == nil || err.Error() != "listen.tls: address in use" {
		t.Errorf("supervise: %v, want the start error as it is", err)
	}
	if want := []string{"stop a", "release a"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
}

package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Service is one thing the node runs: the check loop, a gRPC listener, the metrics
// server, gossip, the enrollment and Kubernetes join, the watchdog. The services that
// start after the join (postJoinServices) run under the supervisor, which makes each
// a Service.
type Service interface {
	// Name is short and stable, for logs and status ("checks", "grpc-unix").
	Name() string
	// Run runs the service until ctx ends, then stops it and returns nil. An error
	// means the service failed and stopped early; the others go on.
	Run(ctx context.Context) error
	// Status says how the service is doing; safe from any goroutine.
	Status() ServiceStatus
}

// ServiceState is where a service is in its life.
type ServiceState int

// The states.
const (
	Starting ServiceState = iota
	Running
	Stopped
	Failed
)

func (s ServiceState) String() string {
	return [...]string{"starting", "running", "stopped", "failed"}[s]
}

// ServiceStatus is a service's report.
type ServiceStatus struct {
	State ServiceState
	// Message says what the service is doing or why it failed, for an operator.
	Message string
	// Since is when State last changed.
	Since time.Time
}

// statusCell is the mutable status a service embeds to implement Status.
type statusCell struct {
	mu sync.Mutex
	st ServiceStatus
}

func (c *statusCell) set(state ServiceState, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.State != state || c.st.Since.IsZero() {
		c.st.Since = time.Now()
	}
	c.st.State, c.st.Message = state, msg
}

// Status implements Service.
func (c *statusCell) Status() ServiceStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// Services runs services, each in its own goroutine, until their context ends. Services
// may be started later (the mTLS listener and gossip once enrollment brings the
// JoinBundle); they join the same set.
type Services struct {
	ctx  context.Context
	log  *slog.Logger
	wg   sync.WaitGroup
	mu   sync.Mutex
	list []Service
	// ended records the services that returned, and with what.
	ended map[Service]error
}

// NewServices returns an empty set whose services run until ctx ends.
func NewServices(ctx context.Context, log *slog.Logger) *Services {
	return &Services{ctx: ctx, log: log, ended: map[Service]error{}}
}

// Start runs svc in a new goroutine.
func (s *Services) Start(svc Service) {
	s.mu.Lock()
	s.list = append(s.list, svc)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := svc.Run(s.ctx)
		s.mu.Lock()
		s.ended[svc] = err
		s.mu.Unlock()
		if err != nil {
			s.log.Error("node service failed", "service", svc.Name(), "error", err)
		}
	}()
}

// Wait returns once every service started so far has returned: call it after the
// context has ended.
func (s *Services) Wait() { s.wg.Wait() }

// NamedStatus is one service's status with its name.
type NamedStatus struct {
	Name string
	ServiceStatus
}

// Statuses reports every service, in the order they started. A service that returned
// is Stopped, or Failed with its error, whatever it last said itself.
func (s *Services) Statuses() []NamedStatus {
	s.mu.Lock()
	list := append([]Service(nil), s.list...)
	ended := make(map[Service]error, len(s.ended))
	for k, v := range s.ended {
		ended[k] = v
	}
	s.mu.Unlock()
	out := make([]NamedStatus, 0, len(list))
	for _, svc := range list {
		st := svc.Status()
		if err, done := ended[svc]; done {
			switch {
			case err != nil:
				st.State, st.Message = Failed, err.Error()
			case st.State != Failed:
				st.State = Stopped
			}
		}
		out = append(out, NamedStatus{Name: svc.Name(), ServiceStatus: st})
	}
	return out
}

// String is one line per service, for logs.
func (n NamedStatus) String() string {
	return fmt.Sprintf("%s: %s (%s)", n.Name, n.State, n.Message)
}

// failedService stands for a post-join service that could not be set up: it fails at
// once with err, said on the console as "gpuagent: WHAT: ERR", so Status shows why it
// is not running.
type failedService struct {
	statusCell
	name, what, console string
	err                 error
}

func (s *failedService) Name() string { return s.name }

func (s *failedService) attempt(context.Context, gated) error {
	consoleLine(s.console, "gpuagent: "+s.what+": "+s.err.Error())
	return s.err
}

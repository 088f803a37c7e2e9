// Package redfishtest is a Redfish service for tests: a BMC in an httptest TLS server,
// shaped as DMTF's public Redfish mockups (DSP2043) show one. It serves the service
// root, the SessionService (POST a session, X-Auth-Token, DELETE it), one or more
// ComputerSystems with a PowerState and a #ComputerSystem.Reset action, and, when asked
// to, answers a Reset with 202 Accepted and a Task under /redfish/v1/TaskService.
//
// The power state follows Reset after Config.PowerDelay (PoweringOn/PoweringOff in
// between), or never (Config.PowerStuck); OnReset lets a test drive something real
// (a QEMU VM over QMP) from each Reset. Requests without a valid session token or
// basic-auth credentials get 401 with a Redfish error body, as BMCs answer.
//
// It is for tests only; nothing outside _test.go files imports it.
package redfishtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// DefaultResetTypes is what a system allows when Config.AllowedResetTypes is nil: the
// list a typical server BMC advertises.
var DefaultResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "PushPowerButton", "PowerCycle"}

// Config shapes the BMC. The zero value is a BMC with one system "1", powered on,
// user "admin" with password "redfishtest", answering Reset at once.
type Config struct {
	// Username and Password are the one account (defaults "admin", "redfishtest").
	Username, Password string
	// SystemIDs are the members of /redfish/v1/Systems (default "1").
	SystemIDs []string
	// PowerState is every system's state at start, "On" or "Off" (default "On").
	PowerState string
	// AllowedResetTypes is ResetType@Redfish.AllowableValues (default
	// DefaultResetTypes); a ResetType outside it is refused with 400.
	AllowedResetTypes []string
	// NoResetAction leaves #ComputerSystem.Reset out of the systems' Actions.
	NoResetAction bool
	// PowerDelay is how long after a Reset the PowerState reaches its new value; the
	// system reports PoweringOn or PoweringOff meanwhile. PowerStuck keeps the
	// PowerState as it is whatever Reset says (a BMC whose host does not follow).
	PowerDelay time.Duration
	PowerStuck bool
	// AsyncTask answers Reset with 202 Accepted and a Task that ends after TaskDelay:
	// Completed, or Exception with a message when TaskFails. The Location header names
	// the Task itself, or with TaskMonitorLocation a task monitor URI that answers 202
	// while the task runs and then the action's own response (204, or 400 if it failed).
	AsyncTask           bool
	TaskDelay           time.Duration
	TaskFails           bool
	TaskMonitorLocation bool
	// OnReset, when set, is called with each accepted ResetType (after the state
	// change is scheduled, outside the server's lock).
	OnReset func(resetType string)
	// Listener, when set, is where the BMC serves (e.g. a socket opened in a test's
	// network namespace); nil: a new one on 127.0.0.1.
	Listener net.Listener
}

// Server is a running test BMC.
type Server struct {
	// URL is the BMC's address, https://127.0.0.1:port.
	URL string

	srv *httptest.Server
	cfg Config

	mu        sync.Mutex
	systems   map[string]*system
	sessions  map[string]string // X-Auth-Token → session Id
	nextID    int
	tasks     map[string]*task
	resets    []string
	logins    int
	refusals  int
	requested []string
}

// system is one ComputerSystem's power.
type system struct {
	state   string
	pending string    // the state being moved to, or ""
	at      time.Time // when pending takes effect
}

// task is one Reset answered with 202.
type task struct {
	id      string
	created time.Time
}

// New starts a BMC shaped by cfg and stops it when t ends.
func New(t testing.TB, cfg Config) *Server {
	t.Helper()
	cfg = withDefaults(cfg)
	s := &Server{cfg: cfg, systems: map[string]*system{}, sessions: map[string]string{}, tasks: map[string]*task{}}
	for _, id := range cfg.SystemIDs {
		s.systems[id] = &system{state: cfg.PowerState}
	}
	s.srv = httptest.NewUnstartedServer(s.routes())
	if cfg.Listener != nil {
		s.srv.Listener.Close()
		s.srv.Listener = cfg.Listener
	}
	// A client refusing the self-signed certificate is a case tests make on purpose.
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.StartTLS()
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

func withDefaults(cfg Config) Config {
	if cfg.Username == "" {
		cfg.Username = "admin"
	}
	if cfg.Password == "" {
		cfg.Password = "redfishtest"
	}
	if len(cfg.SystemIDs) == 0 {
		cfg.SystemIDs = []string{"1"}
	}
	if cfg.PowerState == "" {
		cfg.PowerState = "On"
	}
	if cfg.AllowedResetTypes == nil {
		cfg.AllowedResetTypes = DefaultResetTypes
	}
	return cfg
}

// CAPEM is the PEM of the server's self-signed certificate, for a client to trust.
func (s *Server) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

// Client is an HTTP client that trusts the server's certificate (and sends no
// credentials), for tests that speak to the BMC directly.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Username is the account the BMC accepts.
func (s *Server) Username() string { return s.cfg.Username }

// Password is the account's password.
func (s *Server) Password() string { return s.cfg.Password }

// Close stops the server (New already arranges it at the test's end).
func (s *Server) Close() { s.srv.Close() }

// PowerState is system id's PowerState now, as a GET would report it.
func (s *Server) PowerState(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sys, ok := s.systems[id]
	if !ok {
		return ""
	}
	return sys.current(time.Now())
}

// SetPowerState sets system id's PowerState, dropping any change under way.
func (s *Server) SetPowerState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys, ok := s.systems[id]; ok {
		sys.state, sys.pending = state, ""
	}
}

// Resets are the ResetTypes accepted so far, in order.
func (s *Server) Resets() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resets)
}

// LiveSessions is the number of sessions created and not yet deleted.
func (s *Server) LiveSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Logins is the number of sessions created.
func (s *Server) Logins() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logins
}

// Refusals is the number of requests answered 401.
func (s *Server) Refusals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusals
}

// Requests lists every request so far as "METHOD path", in order.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requested)
}

// current applies a pending change whose time has come and returns the state to
// report: the pending direction (PoweringOn, PoweringOff) while it is under way.
func (sys *system) current(now time.Time) string {
	if sys.pending != "" && !now.Before(sys.at) {
		sys.state, sys.pending = sys.pending, ""
	}
	switch sys.pending {
	case "On":
		return "PoweringOn"
	case "Off":
		return "PoweringOff"
	}
	return sys.state
}

// newID returns the next session or task number, as a string.
func (s *Server) newID() string {
	s.nextID++
	return strconv.Itoa(s.nextID)
}

// newToken is a random X-Auth-Token.
func newToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("redfishtest: random token: %v", err))
	}
	return hex.EncodeToString(b)
}

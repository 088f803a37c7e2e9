package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"

	"github.com/gpurack/gpurack/agent/monitor"
)

// stopGrace is how long a server may take to finish its requests at shutdown.
const stopGrace = 3 * time.Second

// checksService is the monitor's continuous check loop, with its NVML event and
// kernel log watches.
type checksService struct {
	mon      *monitor.Monitor
	interval time.Duration
}

func (s *checksService) Name() string { return "checks" }

func (s *checksService) Run(ctx context.Context) error {
	s.mon.Run(ctx) // returns once the NVML event watch has: NVML may then shut down
	return nil
}

func (s *checksService) Status() ServiceStatus {
	last := s.mon.Last()
	if last == nil {
		return ServiceStatus{State: Starting, Message: "no checklist yet"}
	}
	return ServiceStatus{State: Running, Since: last.FinishedAt,
		Message: fmt.Sprintf("checking every %v; last checklist %s at %s", s.interval, last.Overall, last.FinishedAt.Format(time.RFC3339))}
}

// grpcService serves gRPC on one listener.
type grpcService struct {
	statusCell
	name string
	l    net.Listener
	gs   *grpc.Server
	log  *slog.Logger
	// socket is removed at stop (unix listeners).
	socket string
}

func (s *grpcService) Name() string { return s.name }

// close releases the listener of a service that never ran.
func (s *grpcService) close() { s.l.Close() }

func (s *grpcService) Run(ctx context.Context) error {
	s.log.Info("serving gRPC", "listener", s.name, "address", s.l.Addr().String())
	s.set(Running, "serving on "+s.l.Addr().String())
	served := make(chan error, 1)
	go func() { served <- s.gs.Serve(s.l) }()
	select {
	case err := <-served:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("gRPC on %s: %w", s.l.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { s.gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		s.gs.Stop()
	}
	<-served
	if s.socket != "" {
		os.Remove(s.socket)
	}
	return nil
}

// metricsService serves /metrics.
type metricsService struct {
	statusCell
	l   net.Listener
	srv *http.Server
	log *slog.Logger
	// tls: the listener is TLS with a client certificate required (decision 0693).
	tls bool
}

func (s *metricsService) Name() string { return "metrics" }

func (s *metricsService) close() { s.l.Close() }

func (s *metricsService) Run(ctx context.Context) error {
	how := "plain HTTP, no authentication"
	if s.tls {
		how = "TLS, client certificate required"
	}
	s.log.Info("serving metrics", "address", s.l.Addr().String(), "transport", how)
	s.set(Running, "serving /metrics on "+s.l.Addr().String()+" ("+how+")")
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.l) }()
	select {
	case err := <-served:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics on %s: %w", s.l.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	s.srv.Shutdown(sctx)
	<-served
	return nil
}

// watchdogService sends WATCHDOG=1 at half systemd's WatchdogSec while the check loop
// is alive (a checklist finished within three intervals), so a hung NVML call gets the
// agent restarted.
type watchdogService struct {
	statusCell
	mon      *monitor.Monitor
	interval time.Duration
	log      *slog.Logger
}

func (s *watchdogService) Name() string { return "watchdog" }

func (s *watchdogService) Run(ctx context.Context) error {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil || every == 0 {
		s.set(Stopped, "systemd asks for no watchdog (no WATCHDOG_USEC)")
		return nil
	}
	s.log.Info("systemd watchdog enabled", "timeout", every)
	s.set(Running, fmt.Sprintf("feeding systemd's watchdog every %v", every/2))
	t := time.NewTicker(every / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		last := s.mon.Last()
		if last == nil || time.Since(last.FinishedAt) < 3*s.interval+every {
			daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		} else {
			s.log.Error("check loop stalled; not feeding the watchdog", "last_checklist", last.FinishedAt)
			s.set(Running, "check loop stalled since "+last.FinishedAt.Format(time.RFC3339)+"; not feeding the watchdog")
		}
	}
}

// listenUnix listens on the local unix socket at path, replacing a stale one. The socket
// has no authentication (whoever connects may call every method), so its file mode is
// all that guards it: it is bound in a private directory (0700) made beside path, made
// 0600 (root only) there and only then renamed to path, so it never exists at path with
// a looser mode, whatever the umask. A directory the agent makes for it is 0700.
func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("--socket %s exists and is not a socket: remove it or choose another path", path)
	}
	private, err := os.MkdirTemp(dir, ".s") // short: a unix socket path has at most 107 bytes
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	defer os.RemoveAll(private)
	bound := filepath.Join(private, "s")
	l, err := net.Listen("unix", bound)
	if err != nil {
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	// The name moves; grpcService removes path at stop.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(bound, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if err := os.Rename(bound, path); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	return renamedListener{Listener: l, addr: &net.UnixAddr{Name: path, Net: "unix"}}, nil
}

// renamedListener is a listener whose socket was renamed after it was bound: Addr is
// where clients now connect, for logs and status.
type renamedListener struct {
	net.Listener
	addr net.Addr
}

func (l renamedListener) Addr() net.Addr { return l.addr }

// openDirWarning says, when the socket's directory lets other users in, that it should
// not (the systemd unit makes /run/gpurack 0700); empty when it is private.
func openDirWarning(socket string) string {
	dir := filepath.Dir(socket)
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("the local socket's directory %s is mode %04o: the socket itself is 0600, but make the directory 0700 (chmod 0700 %s) so that no other user can replace or watch it", dir, fi.Mode().Perm(), dir)
}

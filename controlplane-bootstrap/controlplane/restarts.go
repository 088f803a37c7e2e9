package controlplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// The restart protocol between `certs renew` and the supervisor of a foreground control
// plane (`init --foreground`), over the Unix socket components.Layout.SupervisorSocket
// (mode 0600, in the cluster directory):
//
//	client: restart etcd kube-apiserver\n
//	server: progress lines, then "ok\n" or "error: WHY\n"
//
// One request per connection; the supervisor serves them one at a time.
const (
	restartVerb     = "restart"
	restartOK       = "ok"
	restartErr      = "error: "
	maxRequestBytes = 1024
)

// restartGrace is how long a component has to exit after SIGTERM on a restart.
const restartGrace = 20 * time.Second

// parseRestartRequest reads a request line, "restart NAME...", into component names in
// start order. Every name must be a component, once.
func parseRestartRequest(line string) ([]string, error) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != restartVerb {
		return nil, fmt.Errorf("want %q followed by component names", restartVerb)
	}
	for i, name := range f[1:] {
		if !slices.Contains(components.AllNames, name) {
			return nil, fmt.Errorf("unknown component %q; the components are %s", name, strings.Join(components.AllNames, ", "))
		}
		if slices.Contains(f[1:i+1], name) {
			return nil, fmt.Errorf("component %q named twice", name)
		}
	}
	var names []string
	for _, n := range components.AllNames {
		if slices.Contains(f[1:], n) {
			names = append(names, n)
		}
	}
	return names, nil
}

// restartServer accepts restart requests for one control plane.
type restartServer struct {
	ln   net.Listener
	path string
	// ctx ends a restart in progress when the control plane stops.
	ctx    context.Context
	cancel context.CancelFunc
}

// serveRestarts listens on the supervisor socket and restarts what each request names.
func (cp *ControlPlane) serveRestarts(logf func(string, ...any)) error {
	path := cp.Layout.SupervisorSocket()
	// A socket left by a supervisor that was killed: this process holds the PID file now.
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	rs := &restartServer{ln: ln, path: path}
	rs.ctx, rs.cancel = context.WithCancel(context.Background())
	cp.restarts = rs
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			cp.handleRestart(rs.ctx, conn, logf)
		}
	}()
	return nil
}

// close stops taking requests and ends one in progress (its client gets an error).
func (rs *restartServer) close() {
	rs.cancel()
	rs.ln.Close()
	os.Remove(rs.path)
}

func (cp *ControlPlane) handleRestart(ctx context.Context, conn net.Conn, logf func(string, ...any)) {
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(conn, maxRequestBytes)).ReadString('\n')
	if err != nil {
		fmt.Fprintf(conn, "%sread the request: %v\n", restartErr, err)
		return
	}
	names, err := parseRestartRequest(line)
	if err != nil {
		fmt.Fprintf(conn, "%s%v\n", restartErr, err)
		return
	}
	logf("restart requested: %s", strings.Join(names, ", "))
	ctx, cancel := context.WithTimeout(ctx, time.Duration(len(names)+1)*cp.readyTimeout)
	defer cancel()
	if err := cp.RestartComponents(ctx, names, conn); err != nil {
		logf("requested restart failed: %v", err)
		fmt.Fprintf(conn, "%s%s\n", restartErr, strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return
	}
	fmt.Fprintln(conn, restartOK)
}

// RestartComponents restarts the named components of a control plane this process
// supervises (Foreground mode), in start order (etcd before kube-apiserver), each healthy
// before the next, so that they read renewed certificates. Progress goes to out.
func (cp *ControlPlane) RestartComponents(ctx context.Context, names []string, out io.Writer) error {
	if cp.Supervisor == nil {
		return errors.New("this process does not supervise the components")
	}
	cp.restartMu.Lock()
	defer cp.restartMu.Unlock()
	exits := cp.Supervisor.Exits()
	for _, c := range components.Specs(cp.Config, cp.Layout) {
		if !slices.Contains(names, c.Name) {
			continue
		}
		for len(exits) > 0 { // earlier crashes, already restarted: not this restart's
			<-exits
		}
		old := cp.Supervisor.PID(c.Name)
		if err := cp.Supervisor.Restart(c.Name, restartGrace); err != nil {
			return fmt.Errorf("restart %s: %w", c.Name, err)
		}
		// Only this component's exit fails its restart. Another that exits meanwhile
		// (kube-controller-manager still starting when kube-apiserver goes away exits
		// with status 255) is restarted by the supervisor, as any crash is.
		own := func(ev components.Exit) bool { return ev.Name != c.Name }
		if err := cp.waitHealthyExcept(ctx, c, cp.readyTimeout, exits, own); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s restarted (pid %d, was %d) and healthy\n", c.Name, cp.Supervisor.PID(c.Name), old)
	}
	return nil
}

// requestRestart asks the supervisor of l to restart names and copies its progress to
// out.
func requestRestart(ctx context.Context, l components.Layout, names []string, out io.Writer) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", l.SupervisorSocket())
	if err != nil {
		return fmt.Errorf("the supervisor takes no restart requests (%w); it may predate `certs renew`, see %s", err, l.LogFile("supervisor"))
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(conn, "%s %s\n", restartVerb, strings.Join(names, " ")); err != nil {
		return fmt.Errorf("send the restart request: %w", err)
	}
	sc := bufio.NewScanner(conn)
	var last string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == restartOK:
			return nil
		case strings.HasPrefix(line, restartErr):
			msg := strings.TrimPrefix(line, restartErr)
			for sc.Scan() { // a multi-line error continues indented
				msg += "\n" + sc.Text()
			}
			return errors.New(msg)
		}
		last = line
		fmt.Fprintln(out, line)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("waiting for the supervisor (last: %q): %w", last, err)
	}
	return fmt.Errorf("the supervisor closed the connection without an answer (last: %q); see %s", last, l.LogFile("supervisor"))
}

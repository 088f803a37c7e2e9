package components

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one supervised child: the binary, its flags, and where its
// output and PID go.
type Process struct {
	Name    string
	Path    string
	Args    []string
	Env     []string // added to this process's environment
	LogFile string
	PIDFile string
}

// Exit reports that a supervised process ended on its own.
type Exit struct {
	Name     string
	PID      int
	Err      error // from Wait: exit status or signal
	Ran      time.Duration
	Restarts int // restarts so far, this one not counted
}

// Backoff bounds for restarts: the delay starts at InitialBackoff, doubles
// with each crash up to MaxBackoff, and starts over after a run that lasted
// StableAfter.
const (
	InitialBackoff = 1 * time.Second
	MaxBackoff     = 30 * time.Second
	StableAfter    = 60 * time.Second
)

// Supervisor runs processes as its children and restarts each one that exits
// unless Stop was called. The children get SIGTERM if the supervising process
// dies (Pdeathsig), so none outlives it.
type Supervisor struct {
	logf  func(format string, args ...any)
	exits chan Exit

	mu       sync.Mutex
	order    []string
	procs    map[string]*supervised
	stopping bool
}

type supervised struct {
	p        Process
	cmd      *exec.Cmd
	done     chan struct{} // closed when the supervising goroutine returns
	restarts int
	// requested is set while Restart waits for this process to be replaced; the next
	// start sends its result on it.
	requested chan error
}

// NewSupervisor returns a supervisor that reports starts, exits and restarts
// through logf.
func NewSupervisor(logf func(format string, args ...any)) *Supervisor {
	return &Supervisor{logf: logf, exits: make(chan Exit, 64), procs: map[string]*supervised{}}
}

// Exits delivers every unrequested exit (before the restart). It is buffered;
// events are dropped when nobody reads it.
func (s *Supervisor) Exits() <-chan Exit { return s.exits }

// Start starts p and supervises it. The first start is synchronous: an error
// (binary missing, not executable) is returned and nothing is supervised.
func (s *Supervisor) Start(p Process) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("supervisor is stopping")
	}
	if _, ok := s.procs[p.Name]; ok {
		return fmt.Errorf("%s is already supervised", p.Name)
	}
	sp := &supervised{p: p, done: make(chan struct{})}
	if err := sp.start(); err != nil {
		return err
	}
	s.logf("%s started (pid %d)", p.Name, sp.cmd.Process.Pid)
	s.procs[p.Name] = sp
	s.order = append(s.order, p.Name)
	go s.supervise(sp)
	return nil
}

func (sp *supervised) start() error {
	if err := os.MkdirAll(filepath.Dir(sp.p.LogFile), 0o755); err != nil {
		return fmt.Errorf("%s: %w", sp.p.Name, err)
	}
	logf, err := os.OpenFile(sp.p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: open log: %w", sp.p.Name, err)
	}
	defer logf.Close() // the child holds its own copy
	fmt.Fprintf(logf, "---- %s: starting %s\n", time.Now().UTC().Format(time.RFC3339), sp.p.Name)
	cmd := exec.Command(sp.p.Path, sp.p.Args...)
	if len(sp.p.Env) > 0 {
		cmd.Env = append(os.Environ(), sp.p.Env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start %s: %w", sp.p.Name, sp.p.Path, err)
	}
	sp.cmd = cmd
	if sp.p.PIDFile != "" {
		if err := os.MkdirAll(filepath.Dir(sp.p.PIDFile), 0o755); err == nil {
			os.WriteFile(sp.p.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
		}
	}
	return nil
}

func (s *Supervisor) supervise(sp *supervised) {
	defer close(sp.done)
	backoff := InitialBackoff
	for {
		began := time.Now()
		err := sp.cmd.Wait()
		ran := time.Since(began)
		s.mu.Lock()
		stopping, requested := s.stopping, sp.requested != nil
		s.mu.Unlock()
		if stopping {
			return
		}
		retry := backoff
		if requested {
			s.logf("%s (pid %d) stopped for a requested restart", sp.p.Name, sp.cmd.Process.Pid)
		} else {
			if err == nil {
				err = errors.New("exited with status 0")
			}
			ev := Exit{Name: sp.p.Name, PID: sp.cmd.Process.Pid, Err: err, Ran: ran, Restarts: sp.restarts}
			select {
			case s.exits <- ev:
			default:
			}
			if ran >= StableAfter {
				backoff = InitialBackoff
			}
			s.logf("%s (pid %d) %v after %s; restarting in %s (restart %d; log: %s)",
				sp.p.Name, ev.PID, err, ran.Round(time.Millisecond), backoff, sp.restarts+1, sp.p.LogFile)
			if !s.sleep(backoff) {
				return
			}
			retry = backoff
			backoff = min(2*backoff, MaxBackoff)
			s.mu.Lock()
			sp.restarts++
			s.mu.Unlock()
		}
		if !s.startAgain(sp, retry) {
			return
		}
	}
}

// startAgain starts sp's process again, retrying every retry while the start fails
// (waiting on a process that never started would spin), and answers a pending Restart
// with the first attempt's result. It returns false when Stop is called.
func (s *Supervisor) startAgain(sp *supervised, retry time.Duration) bool {
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return false
		}
		err := sp.start()
		if sp.requested != nil {
			sp.requested <- err
			sp.requested = nil
		}
		s.mu.Unlock()
		if err == nil {
			s.logf("%s restarted (pid %d)", sp.p.Name, sp.cmd.Process.Pid)
			return true
		}
		s.logf("%s: restart failed: %v; trying again in %s", sp.p.Name, err, retry)
		if !s.sleep(retry) {
			return false
		}
	}
}

// Restart stops the process called name (SIGTERM, then SIGKILL after grace) and starts
// it again at once, so that it reads its files again (renewed certificates). A requested
// restart is not reported on Exits, not counted by Restarts and not delayed by backoff.
// It returns when the new process has started, or with why it could not start.
func (s *Supervisor) Restart(name string, grace time.Duration) error {
	s.mu.Lock()
	sp, ok := s.procs[name]
	switch {
	case !ok:
		s.mu.Unlock()
		return fmt.Errorf("%s is not supervised", name)
	case s.stopping:
		s.mu.Unlock()
		return errors.New("supervisor is stopping")
	case sp.requested != nil:
		s.mu.Unlock()
		return fmt.Errorf("%s is being restarted already", name)
	}
	started := make(chan error, 1)
	sp.requested = started
	proc := sp.cmd.Process
	s.mu.Unlock()
	// A process that already exited (waiting out a crash's backoff) is started by
	// supervise after the backoff, which answers this request too.
	proc.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		select {
		case err := <-started:
			return err
		case <-sp.done:
			return errors.New("supervisor is stopping")
		case <-timer.C:
			s.logf("%s did not stop within %s; killing it", name, grace)
			proc.Kill()
		}
	}
}

// sleep waits d, or returns false early if Stop is called.
func (s *Supervisor) sleep(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if stopping {
			return false
		}
		time.Sleep(min(50*time.Millisecond, time.Until(deadline)))
	}
	return true
}

// PID returns the current PID of the process called name, or 0.
func (s *Supervisor) PID(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.procs[name]
	if !ok || sp.cmd == nil || sp.cmd.Process == nil {
		return 0
	}
	return sp.cmd.Process.Pid
}

// Restarts returns how often the process called name has been restarted.
func (s *Supervisor) Restarts(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp, ok := s.procs[name]; ok {
		return sp.restarts
	}
	return 0
}

// Stop ends supervision and terminates the processes in reverse start order:
// SIGTERM, then SIGKILL for one still running after grace. It removes their
// PID files and returns when all have exited.
func (s *Supervisor) Stop(grace time.Duration) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	order := slices.Clone(s.order)
	s.mu.Unlock()
	slices.Reverse(order)
	for _, name := range order {
		s.mu.Lock()
		sp := s.procs[name]
		proc := sp.cmd.Process
		s.mu.Unlock()
		proc.Signal(syscall.SIGTERM)
		select {
		case <-sp.done:
		case <-time.After(grace):
			s.logf("%s did not stop within %s; killing it", name, grace)
			s.mu.Lock()
			sp.cmd.Process.Kill()
			s.mu.Unlock()
			<-sp.done
		}
		if sp.p.PIDFile != "" {
			os.Remove(sp.p.PIDFile)
		}
		s.logf("%s stopped", name)
	}
}

// TailFile returns the last n lines of path, for error messages that show
// why a component failed. It returns "" if the file cannot be read.
func TailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 64<<10 {
		data = data[len(data)-64<<10:]
	}
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(data, nil)), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

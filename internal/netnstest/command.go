//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// exitTimeout bounds how long cleanup waits for a killed process to exit.
const exitTimeout = 10 * time.Second

// errStillRunning is returned when a killed process does not exit.
var errStillRunning = errors.New("still running after SIGKILL")

// Command returns a command that runs name with args inside namespace ns
// (as `ip netns exec ns name args...`; ns "" runs it directly in the test
// process's namespace). The caller sets Stdout, Env and so on, then calls
// Start and Wait, or Run, Output and the like.
//
// The process gets its own process group. When the test's context is
// cancelled, and again in cleanup, the whole group is killed with SIGKILL,
// and cleanup waits for it to exit so that it no longer holds the namespace,
// its ports or its tap devices. Cleanup does not reap it: a caller that
// starts a command should still Wait for it. Replacing SysProcAttr or
// Cancel gives up the group kill.
func (e *Env) Command(ns, name string, arg ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if ns == "" {
		cmd = exec.CommandContext(e.t.Context(), name, arg...)
	} else {
		cmd = exec.CommandContext(e.t.Context(), "ip", append([]string{"netns", "exec", ns, name}, arg...)...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the test binary dies without running cleanup (a -timeout
		// panic, a crash), the kernel kills the child.
		Pdeathsig: syscall.SIGKILL,
	}
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	e.mu.Lock()
	e.commands = append(e.commands, cmd)
	e.mu.Unlock()
	return cmd
}

// Run runs name with args inside namespace ns, waits for it and returns its
// combined stdout and stderr. On failure the error names the command and
// contains the output.
func (e *Env) Run(ns, name string, arg ...string) (string, error) {
	return combinedOutput(e.Command(ns, name, arg...))
}

// killGroup sends SIGKILL to p's process group, and to p itself in case it
// has left the group. It returns os.ErrProcessDone if p has already been
// waited for; the group is then left alone, because its id may have been
// reused.
func killGroup(p *os.Process) error {
	if err := p.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) {
		return os.ErrProcessDone
	}
	groupErr := syscall.Kill(-p.Pid, syscall.SIGKILL)
	if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if groupErr != nil && !errors.Is(groupErr, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", p.Pid, groupErr)
	}
	return nil
}

// stop kills a command started from Command, if it was started and not yet
// waited for, and waits until it has exited.
func stop(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil // never started
	}
	desc := strings.Join(cmd.Args, " ")
	err := killGroup(cmd.Process)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", desc, cmd.Process.Pid, err)
	}
	deadline := time.Now().Add(exitTimeout)
	for !exited(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d): %w for %v", desc, cmd.Process.Pid, errStillRunning, exitTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// exited reports whether process pid has exited: it is gone, or a zombie
// waiting to be reaped. A zombie holds no namespaces, sockets or devices.
func exited(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state == 'Z' || state == 'X'
}

package controlplane

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestWaitGoneTakesAZombieAsGone: a child that has exited but is not reaped yet is gone
// for waitGone (stop must not wait 60 s for a parent to reap its supervisor); a running
// one is not.
func TestWaitGoneTakesAZombieAsGone(t *testing.T) {
	running := exec.Command("sleep", "30")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { running.Process.Kill(); running.Wait() }()
	if waitGone(context.Background(), running.Process.Pid, 200*time.Millisecond) {
		t.Error("waitGone: a running process is gone")
	}
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	if !waitGone(context.Background(), zombie.Process.Pid, 5*time.Second) {
		t.Error("waitGone: an exited, unreaped child is not gone")
	}
}

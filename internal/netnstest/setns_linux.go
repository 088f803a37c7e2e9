package netnstest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` mounts named namespaces (iproute2's
// NETNS_RUN_DIR).
const netnsDir = "/var/run/netns"

// InNamespace runs fn on a new goroutine locked to an OS thread that has
// joined network namespace ns, and returns fn's error. Sockets that fn
// opens (net.Listen, net.Dial, net.ListenPacket) stay in ns after fn
// returns and may be used from any goroutine; goroutines that fn starts do
// not run in ns. ns "" runs fn directly.
//
// Afterwards the thread rejoins its original namespace and goes back to the
// pool. If it cannot, the thread stays locked, so the Go runtime destroys it
// instead of reusing it, and the error says so. A panic in fn is re-raised
// in the caller with fn's stack trace.
func InNamespace(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	type result struct {
		err      error
		panicked bool
		panicVal any
		stack    []byte
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		restored := false
		res := result{err: fmt.Errorf("netnstest: function in namespace %s called runtime.Goexit (t.FailNow outside the test goroutine?)", ns)}
		defer func() {
			done <- res
			if restored {
				runtime.UnlockOSThread()
			}
			// Otherwise the goroutine exits still locked and the runtime
			// terminates the thread, which is in the wrong namespace.
		}()
		restored, res.err = joinAndRun(ns, func() error {
			defer func() {
				if p := recover(); p != nil {
					res.panicked, res.panicVal, res.stack = true, p, debug.Stack()
				}
			}()
			return fn()
		})
	}()
	res := <-done
	if res.panicked {
		panic(fmt.Sprintf("netnstest: panic in namespace %s: %v\n\n%s", ns, res.panicVal, res.stack))
	}
	return res.err
}

// joinAndRun moves the calling (locked) thread into ns, runs fn and moves it
// back. restored is false only if the thread is left in another namespace.
func joinAndRun(ns string, fn func() error) (restored bool, err error) {
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
	if err != nil {
		return true, fmt.Errorf("netnstest: open this thread's network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join(netnsDir, ns))
	if err != nil {
		return true, fmt.Errorf("netnstest: open network namespace %s (was it created with `ip netns add`?): %w", ns, err)
	}
	defer target.Close()
	if err := setns(target); err != nil {
		return true, fmt.Errorf("netnstest: join network namespace %s: %w", ns, err)
	}
	err = fn()
	if rerr := setns(orig); rerr != nil {
		return false, fmt.Errorf("netnstest: rejoin original network namespace after %s (thread discarded): %w (function error: %v)", ns, rerr, err)
	}
	return true, err
}

// setns joins the network namespace that f refers to; see setns(2).
func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

//go:build linux

package netnstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv selects a helper mode when the test binary is re-executed
// inside a namespace by Env.Command; helperAddrEnv is the address to use.
const (
	helperEnv     = "NETNSTEST_HELPER"
	helperAddrEnv = "NETNSTEST_ADDR"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Getenv(helperAddrEnv)))
	}
	os.Exit(m.Run())
}

// helperMain is a tiny server run as a child process: "tcp-echo" echoes
// every TCP connection, "udp-bind" binds a UDP socket and reads forever,
// "sleep" sleeps.
func helperMain(mode, addr string) int {
	switch mode {
	case "tcp-echo":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for {
			conn, err := ln.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			go func() {
				defer conn.Close()
				io.Copy(conn, conn)
			}()
		}
	case "udp-bind":
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return 1
			}
		}
	case "sleep":
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 2
}

// startHelper starts this test binary in helper mode inside ns. The test
// does not wait for it: Env's cleanup must kill it.
func startHelper(t *testing.T, env *Env, ns, mode, addr string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := env.Command(ns, self)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperAddrEnv+"="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper %s in %s: %v", mode, ns, err)
	}
	return cmd
}

// listenIn opens a TCP listener on addr inside ns that echoes one line per
// connection back in upper case, and closes it when the test ends.
func listenIn(t *testing.T, ns, addr string) {
	t.Helper()
	var ln net.Listener
	err := InNamespace(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				line, _ := bufio.NewReader(conn).ReadString('\n')
				io.WriteString(conn, strings.ToUpper(line))
			}()
		}
	}()
}

// roundTrip dials addr from inside ns, sends msg plus a newline and returns
// the line that comes back.
func roundTrip(ns, addr, msg string) (string, error) {
	var conn net.Conn
	err := InNamespace(ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func netnsList(t *testing.T) string {
	t.Helper()
	out, err := runIP("", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVethPairCarriesTCP(t *testing.T) {
	env := New(t)
	server, client, stranger := env.Namespace(), env.Namespace(), env.Namespace()
	s, c := env.Veth(server, client)
	env.AddAddr(s, "192.0.2.1/24")
	env.AddAddr(c, "192.0.2.2/24")

	listenIn(t, server, "192.0.2.1:7000")
	got, err := roundTrip(client, "192.0.2.1:7000", "hello")
	if err != nil {
		t.Fatalf("client namespace could not reach server namespace over the veth pair: %v", err)
	}
	if got != "HELLO" {
		t.Errorf("echo = %q, want %q", got, "HELLO")
	}

	// A namespace with no link to the others has no route to them.
	if _, err := roundTrip(stranger, "192.0.2.1:7000", "hello"); err == nil {
		t.Errorf("namespace %s reached 192.0.2.1 without any link to it", stranger)
	}
}

func TestVethPairCarriesIPv6(t *testing.T) {
	env := New(t)
	server, client := env.Namespace(), env.Namespace()
	s, c := env.Veth(server, client)
	env.AddAddr(s, "2001:db8::1/64")
	env.AddAddr(c, "2001:db8::2/64")

	listenIn(t, server, "[2001:db8::1]:7000")
	got, err := roundTrip(client, "[2001:db8::1]:7000", "six")
	if err != nil {
		t.Fatalf("IPv6 over the veth pair (addresses should skip DAD): %v", err)
	}
	if got != "SIX" {
		t.Errorf("echo = %q, want %q", got, "SIX")
	}
}

func TestBridgeJoinsThreeNamespaces(t *testing.T) {
	env := New(t)
	hub, a, b := env.Namespace(), env.Namespace(), env.Namespace()
	br := env.Bridge(hub)
	env.AddAddr(br, "192.0.2.254/24")
	for _, ns := range []string{a, b} {
		inside, port := env.Veth(ns, hub)
		env.Attach(br, port)
		if ns == a {
			env.AddAddr(inside, "192.0.2.1/24")
		} else {
			env.AddAddr(inside, "192.0.2.2/24")
		}
	}

	// a server process in b, reached from a through the bridge
	startHelper(t, env, b, "tcp-echo", "192.0.2.2:7000")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := WaitPortIn(ctx, b, "tcp", "192.0.2.2:7000"); err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(a, "192.0.2.2:7000", "via bridge"); err != nil || got != "via bridge" {
		t.Errorf("a -> b through the bridge: got %q, %v; want %q", got, err, "via bridge")
	}

	// a listener on the bridge itself in hub, reached from b
	listenIn(t, hub, "192.0.2.254:7001")
	if got, err := roundTrip(b, "192.0.2.254:7001", "hub"); err != nil || got != "HUB" {
		t.Errorf("b -> hub's bridge address: got %q, %v; want %q", got, err, "HUB")
	}
}

func TestTap(t *testing.T) {
	env := New(t)
	ns := env.Namespace()
	tap := env.Tap(ns)
	br := env.Bridge(ns)
	env.Attach(br, tap)

	out, err := runIP(ns, "-d", "link", "show", "dev", tap.Name)
	if err != nil {
		t.Fatalf("tap device missing: %v", err)
	}
	for _, want := range []string{"tun type tap", "persist on", "master " + br.Name} {
		if !strings.Contains(out, want) {
			t.Errorf("ip -d link show %s lacks %q:\n%s", tap, want, out)
		}
	}
	if len(tap.Name) > maxLinkName {
		t.Errorf("tap name %q is longer than %d bytes", tap.Name, maxLinkName)
	}
}

func TestSubtestCleanupRemovesEverything(t *testing.T) {
	var (
		namespaces []string
		hostLinks  []Link
		cmd        *exec.Cmd
	)
	t.Run("build", func(t *testing.T) {
		env := New(t)
		a, b := env.Namespace(), env.Namespace()
		env.Veth(a, b)
		hostEnd, _ := env.Veth("", a)
		env.Tap(a)
		env.Attach(env.Bridge(b), func() Link { _, p := env.Veth(a, b); return p }())
		cmd = startHelper(t, env, a, "sleep", "")
		namespaces = []string{a, b}
		hostLinks = []Link{hostEnd}

		list := netnsList(t)
		for _, ns := range namespaces {
			if !strings.Contains(list, ns) {
				t.Fatalf("ip netns list lacks %s during the test:\n%s", ns, list)
			}
		}
		if _, err := runIP("", "link", "show", "dev", hostEnd.Name); err != nil {
			t.Fatalf("host end of veth missing during the test: %v", err)
		}
	})
	if t.Failed() {
		return
	}

	list := netnsList(t)
	for _, ns := range namespaces {
		if strings.Contains(list, ns) {
			t.Errorf("namespace %s still in ip netns list after its subtest ended:\n%s", ns, list)
		}
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after its subtest ended (stat: %v)", filepath.Join(netnsDir, ns), err)
		}
	}
	for _, l := range hostLinks {
		if out, err := runIP("", "link", "show", "dev", l.Name); err == nil {
			t.Errorf("host link %s still exists after its subtest ended:\n%s", l, out)
		}
	}
	assertKilled(t, cmd)
}

// assertKilled reaps cmd, which cleanup should already have killed.
func assertKilled(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("process %s ended with %v, want killed by SIGKILL", cmd, cmd.ProcessState)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Errorf("process %s started in the subtest is still running after cleanup", cmd)
	}
}

// fakeT stands in for a *testing.T so that a test body can fail without
// failing this package's tests. Like the testing package, runTest runs the
// registered cleanups after the body returns, calls FailNow, or panics.
type fakeT struct {
	testing.TB
	failures []string
	cleanups []func()
}

func (f *fakeT) Helper()           {}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(format string, args ...any) {
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}
func (f *fakeT) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeT) FailNow()          { f.Fatalf("FailNow") }

func (f *fakeT) runTest(body func(testing.TB)) (panicked bool) {
	done := make(chan bool, 1)
	go func() {
		p := false
		defer func() {
			if recover() != nil {
				p = true
			}
			for _, fn := range slices.Backward(f.cleanups) {
				fn()
			}
			done <- p
		}()
		body(f)
	}()
	return <-done
}

func TestCleanupAfterFatalOrPanic(t *testing.T) {
	Require(t)
	for _, tc := range []struct {
		name string
		fail func(testing.TB)
	}{
		{"fatal", func(tb testing.TB) { tb.Fatalf("deliberate failure") }},
		{"panic", func(testing.TB) { panic("deliberate panic") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeT{TB: t}
			var (
				ns       string
				hostLink Link
				cmd      *exec.Cmd
				reached  bool
			)
			panicked := ft.runTest(func(tb testing.TB) {
				env := New(tb)
				ns = env.Namespace()
				hostLink, _ = env.Veth("", ns)
				cmd = startHelper(t, env, ns, "sleep", "")
				tc.fail(tb)
				reached = true
			})
			if reached {
				t.Fatal("test body continued past its failure")
			}
			if tc.name == "fatal" && (panicked || !slices.Contains(ft.failures, "deliberate failure")) {
				t.Fatalf("fake test did not record the Fatalf: failures %q, panicked %v", ft.failures, panicked)
			}
			if tc.name == "panic" && !panicked {
				t.Fatal("fake test did not panic")
			}
			for _, f := range ft.failures {
				if strings.HasPrefix(f, "netnstest:") {
					t.Errorf("cleanup reported: %s", f)
				}
			}
			if ns == "" || cmd == nil {
				t.Fatal("fake test body did not get as far as creating things")
			}
			if list := netnsList(t); strings.Contains(list, ns) {
				t.Errorf("namespace %s survived a failing test:\n%s", ns, list)
			}
			if out, err := runIP("", "link", "show", "dev", hostLink.Name); err == nil {
				t.Errorf("host link %s survived a failing test:\n%s", hostLink, out)
			}
			assertKilled(t, cmd)
		})
	}
}

func TestWaitPortUDP(t *testing.T) {
	env := New(t)
	ns := env.Namespace()
	l, _ := env.Veth(ns, env.Namespace())
	env.AddAddr(l, "192.0.2.1/24")

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := WaitPortIn(ctx, ns, "udp", "192.0.2.1:6969")
	if err == nil || !strings.Contains(err.Error(), "192.0.2.1:6969") {
		t.Fatalf("WaitPortIn before anything is bound = %v, want a timeout naming the address", err)
	}

	startHelper(t, env, ns, "udp-bind", "0.0.0.0:6969")
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, addr := range []string{"192.0.2.1:6969", ":6969", "0.0.0.0:6969"} {
		if err := WaitPortIn(ctx, ns, "udp", addr); err != nil {
			t.Errorf("WaitPortIn(udp, %s) with 0.0.0.0:6969 bound: %v", addr, err)
		}
	}
	// The socket is in ns, not in the test process's namespace.
	short, cancelShort := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancelShort()
	if err := WaitPort(short, "udp", ":6969"); err == nil {
		t.Errorf("WaitPort in the host namespace saw a UDP socket bound inside %s", ns)
	}
}

func TestWaitPortTCPTimeoutSaysWhy(t *testing.T) {
	env := New(t)
	ns := env.Namespace()
	// Long enough for a refused dial to complete on a loaded host; a dial the deadline
	// cuts short does not hide the earlier tries' reason.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := WaitPortIn(ctx, ns, "tcp", "127.0.0.1:1")
	if err == nil {
		t.Fatal("WaitPortIn on a closed port succeeded")
	}
	for _, want := range []string{ns, "127.0.0.1:1", "deadline exceeded", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if err := WaitPort(t.Context(), "sctp", "127.0.0.1:1"); err == nil {
		t.Error("WaitPort accepted network sctp")
	}
}

func TestRunErrorNamesCommandAndOutput(t *testing.T) {
	env := New(t)
	ns := env.Namespace()
	out, err := env.Run(ns, "ip", "link", "show", "dev", "lo")
	if err != nil || !strings.Contains(out, "LOOPBACK,UP") {
		t.Fatalf("lo in a new namespace: %q, %v; want it up", out, err)
	}
	_, err = env.Run(ns, "ip", "link", "show", "dev", "no-such-link")
	if err == nil {
		t.Fatal("ip link show of a missing device succeeded")
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Errorf("error %v does not wrap *exec.ExitError", err)
	}
	for _, want := range []string{"ip netns exec " + ns + " ip link show dev no-such-link", `"no-such-link" does not exist`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestInNamespace(t *testing.T) {
	env := New(t)
	ns := env.Namespace()
	hostNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	nsInode, err := os.Stat(filepath.Join(netnsDir, ns))
	if err != nil {
		t.Fatal(err)
	}
	wantInside := fmt.Sprintf("net:[%d]", nsInode.Sys().(*syscall.Stat_t).Ino)

	for range 50 {
		err := InNamespace(ns, func() error {
			got, err := os.Readlink("/proc/thread-self/ns/net")
			if err != nil {
				return err
			}
			if got != wantInside {
				return fmt.Errorf("inside InNamespace the thread is in %s, want %s", got, wantInside)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every thread that ran fn went back to the host namespace.
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if got, err := os.Readlink(task); err == nil && got != hostNS {
			t.Errorf("%s is %s after InNamespace returned, want %s", task, got, hostNS)
		}
	}

	if want := errors.New("from fn"); !errors.Is(InNamespace(ns, func() error { return want }), want) {
		t.Error("InNamespace did not return fn's error")
	}
	if err := InNamespace("gpr-does-not-exist", func() error { return nil }); err == nil {
		t.Error("InNamespace of a missing namespace succeeded")
	}

	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "boom") {
				t.Errorf("recovered %v, want fn's panic re-raised", p)
			}
		}()
		InNamespace(ns, func() error { panic("boom") })
	}()
}

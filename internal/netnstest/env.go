//go:build linux

package netnstest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// maxLinkName is the longest interface name Linux accepts (IFNAMSIZ - 1).
const maxLinkName = 15

// Env is one test's network topology. It records every namespace, host-side
// link and process it creates and removes them all in a t.Cleanup.
type Env struct {
	t  testing.TB
	id string // random, 6 hex digits; part of every name this Env makes

	mu         sync.Mutex
	counts     map[string]int // last number used in names, by kind
	namespaces []string       // created namespaces, in creation order
	hostLinks  []string       // links created in the test process's own namespace
	commands   []*exec.Cmd    // every command handed out by Command
}

// Link is a network interface made by an Env.
type Link struct {
	Name  string // interface name, at most 15 bytes
	Netns string // namespace that holds it; "" for the test process's own
}

// String returns "netns/name", or "name" for a link in the host namespace.
func (l Link) String() string {
	if l.Netns == "" {
		return l.Name
	}
	return l.Netns + "/" + l.Name
}

// New calls Require, then returns an empty Env whose namespaces, links and
// processes are all deleted when t's cleanup runs.
func New(t testing.TB) *Env {
	t.Helper()
	Require(t)
	e := &Env{t: t, id: fmt.Sprintf("%06x", rand.Uint32()&0xffffff)}
	t.Cleanup(func() {
		for _, err := range e.cleanup() {
			t.Errorf("netnstest: cleanup: %v", err)
		}
	})
	return e
}

// Namespace creates a network namespace named "gpr-<id>-<n>" (it shows in
// `ip netns list`), brings its loopback interface up and returns the name.
func (e *Env) Namespace() string {
	e.t.Helper()
	name := "gpr-" + e.id + "-" + strconv.Itoa(e.next("ns"))
	e.ip("", "netns", "add", name)
	e.record(&e.namespaces, name)
	e.ip(name, "link", "set", "lo", "up")
	return name
}

// Veth creates a veth pair with one end in nsA and the other in nsB ("" is
// the test process's namespace) and sets both ends up. Deleting either end,
// or the namespace holding it, deletes the pair.
func (e *Env) Veth(nsA, nsB string) (a, b Link) {
	e.t.Helper()
	n := e.next("v")
	a = Link{Name: e.linkName("v", n, "a"), Netns: nsA}
	b = Link{Name: e.linkName("v", n, "b"), Netns: nsB}
	args := []string{"link", "add", a.Name}
	if nsA != "" {
		args = append(args, "netns", nsA)
	}
	args = append(args, "type", "veth", "peer", "name", b.Name)
	if nsB != "" {
		args = append(args, "netns", nsB)
	}
	e.ip("", args...)
	e.recordHostLink(a)
	e.recordHostLink(b)
	e.up(a)
	e.up(b)
	return a, b
}

// Bridge creates a Linux bridge in ns ("" is the test process's namespace)
// and sets it up. STP is off, so ports forward as soon as they are up.
func (e *Env) Bridge(ns string) Link {
	e.t.Helper()
	br := Link{Name: e.linkName("br", e.next("br"), ""), Netns: ns}
	e.ip(ns, "link", "add", "name", br.Name, "type", "bridge")
	e.recordHostLink(br)
	e.up(br)
	return br
}

// Attach makes port a port of bridge. Both must be in the same namespace.
func (e *Env) Attach(bridge, port Link) {
	e.t.Helper()
	if bridge.Netns != port.Netns {
		e.t.Fatalf("netnstest: attach %s to bridge %s: a bridge and its ports must be in the same namespace", port, bridge)
	}
	e.ip(port.Netns, "link", "set", "dev", port.Name, "master", bridge.Name)
}

// Tap creates a persistent tap device in ns ("" is the test process's
// namespace), owned by this process's uid so that a process of that user
// running in ns can open it by name (QEMU: -netdev tap,ifname=NAME,script=no,
// downscript=no, started with Command(ns, ...)), and sets it up. Its carrier
// stays down until some process opens it.
func (e *Env) Tap(ns string) Link {
	e.t.Helper()
	tap := Link{Name: e.linkName("t", e.next("t"), ""), Netns: ns}
	e.ip(ns, "tuntap", "add", "dev", tap.Name, "mode", "tap", "user", strconv.Itoa(os.Getuid()))
	e.recordHostLink(tap)
	e.up(tap)
	return tap
}

// AddAddr assigns cidr (for example "192.0.2.1/24" or "2001:db8::1/64") to
// l. IPv6 addresses skip duplicate address detection, so they are usable at
// once instead of after a second or two of being "tentative".
func (e *Env) AddAddr(l Link, cidr string) {
	e.t.Helper()
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		e.t.Fatalf("netnstest: add address to %s: %q is not an address with a prefix length like 192.0.2.1/24: %v", l, cidr, err)
	}
	args := []string{"addr", "add", cidr, "dev", l.Name}
	if prefix.Addr().Is6() {
		args = append(args, "nodad")
	}
	e.ip(l.Netns, args...)
}

func (e *Env) up(l Link) {
	e.t.Helper()
	e.ip(l.Netns, "link", "set", "dev", l.Name, "up")
}

// ip runs the ip tool in ns ("" for the test process's namespace) and fails
// the test, naming the command and its output, if it fails.
func (e *Env) ip(ns string, args ...string) {
	e.t.Helper()
	if _, err := runIP(ns, args...); err != nil {
		e.t.Fatalf("netnstest: %v", err)
	}
}

func runIP(ns string, args ...string) (string, error) {
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	return combinedOutput(exec.Command("ip", args...))
}

// combinedOutput runs cmd and returns its combined output; the error names
// the command and includes the output.
func combinedOutput(cmd *exec.Cmd) (string, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		shown := strings.TrimSpace(string(out))
		if shown == "" {
			shown = "(no output)"
		}
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, shown)
	}
	return string(out), nil
}

// next returns the next number for a name of the given kind, so that each
// kind gets the full length Linux allows for interface names.
func (e *Env) next(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = make(map[string]int)
	}
	e.counts[kind]++
	return e.counts[kind]
}

// linkName returns "gpr-<id>-<kind><n><end>", failing the test if that is
// longer than Linux allows.
func (e *Env) linkName(kind string, n int, end string) string {
	e.t.Helper()
	name := "gpr-" + e.id + "-" + kind + strconv.Itoa(n) + end
	if len(name) > maxLinkName {
		e.t.Fatalf("netnstest: interface name %q is longer than %d bytes; use fewer links of this kind per Env", name, maxLinkName)
	}
	return name
}

func (e *Env) record(list *[]string, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	*list = append(*list, name)
}

// recordHostLink remembers l for cleanup if it is in the host namespace.
// Links inside a created namespace go away with it.
func (e *Env) recordHostLink(l Link) {
	if l.Netns == "" {
		e.record(&e.hostLinks, l.Name)
	}
}

// cleanup kills the processes, then deletes host links and namespaces, in
// reverse creation order. Things already gone are not errors.
func (e *Env) cleanup() []error {
	e.mu.Lock()
	commands := slices.Clone(e.commands)
	hostLinks := slices.Clone(e.hostLinks)
	namespaces := slices.Clone(e.namespaces)
	e.mu.Unlock()

	var errs []error
	for _, cmd := range slices.Backward(commands) {
		if err := stop(cmd); err != nil {
			errs = append(errs, err)
		}
	}
	// Host links go before namespaces: deleting a veth end is synchronous,
	// while a namespace's links are destroyed asynchronously after
	// `ip netns del`.
	for _, name := range slices.Backward(hostLinks) {
		if out, err := runIP("", "link", "del", "dev", name); err != nil && !strings.Contains(out, "Cannot find device") {
			errs = append(errs, err)
		}
	}
	for _, ns := range slices.Backward(namespaces) {
		if out, err := runIP("", "netns", "del", ns); err != nil && !strings.Contains(out, "No such file") {
			errs = append(errs, err)
		}
	}
	return errs
}

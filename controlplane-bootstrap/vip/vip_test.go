//go:build linux

package vip_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/cpbbin"
	"github.com/gpurack/gpurack/controlplane-bootstrap/vip"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The lab's addresses: one /24 on one bridge.
const (
	vipCIDR  = "10.213.0.100/24"
	vipURL   = "http://10.213.0.100:8080/"
	etcdAddr = "10.213.0.1:2379" // the bridge's own address, in the LAN namespace
	httpAddr = "0.0.0.0:8080"    // each host's name server
)

// k8sRequiredEnv is testcluster.RequiredEnv: set to 1, a missing etcd binary fails
// the test instead of skipping it.
const k8sRequiredEnv = "GPURACK_K8S_REQUIRED"

func TestMain(m *testing.M) {
	code := m.Run()
	cpbbin.Remove()
	os.Exit(code)
}

// lab is one test's network: a LAN namespace with a bridge and etcd on it, three
// control-plane host namespaces cp1..cp3 and a client namespace, each on a veth to
// the bridge. The stand-in etcd is plain HTTP with one member: TLS is not what is
// under test.
type lab struct {
	t      *testing.T
	env    *netnstest.Env
	bin    string
	lan    string
	client string
	clink  netnstest.Link // the client's end of its veth
	hosts  []*vipHost
	etcdP  *exec.Cmd
	etcd   *clientv3.Client // dialled from inside the LAN namespace
	http   *http.Client     // dials from inside the client namespace
}

// vipHost is one control-plane host namespace and its vip process.
type vipHost struct {
	name   string
	ns     string
	link   netnstest.Link // its end of the veth, which holds the VIP
	proc   *exec.Cmd
	exited chan struct{} // closed when proc has exited
	exitAt time.Time     // when it exited; read after exited is closed
	log    *syncBuffer
}

func newLab(t *testing.T) *lab {
	t.Helper()
	etcdBin, err := components.FindBinary(components.BinDir(""), "etcd")
	if err != nil {
		testreq.Missing(t, "the pinned etcd binary is not here: "+err.Error(), "run `make k8s-bins`", k8sRequiredEnv)
	}
	bin := cpbbin.Path(t)
	etcdDir := t.TempDir() // before New: its cleanup runs after etcd is killed
	l := &lab{t: t, env: netnstest.New(t), bin: bin}
	l.lan = l.env.Namespace()
	br := l.env.Bridge(l.lan)
	l.env.AddAddr(br, "10.213.0.1/24")
	join := func(ns, cidr string) netnstest.Link {
		lanEnd, nsEnd := l.env.Veth(l.lan, ns)
		l.env.Attach(br, lanEnd)
		l.env.AddAddr(nsEnd, cidr)
		return nsEnd
	}
	for i := 1; i <= 3; i++ {
		h := &vipHost{name: fmt.Sprintf("cp%d", i), ns: l.env.Namespace()}
		h.link = join(h.ns, fmt.Sprintf("10.213.0.1%d/24", i))
		l.serveName(h)
		l.hosts = append(l.hosts, h)
	}
	l.client = l.env.Namespace()
	l.clink = join(l.client, "10.213.0.20/24")
	l.startEtcd(etcdBin, etcdDir)
	l.etcd = l.etcdClient()
	l.http = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // each request a new connection, through the client's ARP cache
		DialContext:       dialIn(l.client, 500*time.Millisecond),
	}}
	return l
}

// dialIn returns a dial function whose sockets are made inside namespace ns.
func dialIn(ns string, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := netnstest.InNamespace(ns, func() error {
			var err error
			conn, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// serveName answers every HTTP request to port 8080 in h's namespace with h's name,
// as the API server on that host would answer through the VIP.
func (l *lab) serveName(h *vipHost) {
	l.t.Helper()
	var ln net.Listener
	if err := netnstest.InNamespace(h.ns, func() error {
		var err error
		ln, err = net.Listen("tcp", httpAddr)
		return err
	}); err != nil {
		l.t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, h.name)
	})}
	go srv.Serve(ln)
	l.t.Cleanup(func() { srv.Close() })
}

// startEtcd runs a one-member etcd in the LAN namespace, serving plain HTTP on the
// bridge's address, and waits until it listens.
func (l *lab) startEtcd(etcdBin, dir string) {
	l.t.Helper()
	cmd := l.env.Command(l.lan, etcdBin, "--name", "vip-test", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://"+etcdAddr, "--advertise-client-urls", "http://"+etcdAddr,
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "vip-test=http://127.0.0.1:2380", "--log-level", "warn")
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.etcdP = cmd
	go cmd.Wait()
	l.t.Cleanup(func() {
		if l.t.Failed() {
			l.t.Logf("etcd log:\n%s", log)
		}
	})
	ctx, cancel := context.WithTimeout(l.t.Context(), 30*time.Second)
	defer cancel()
	if err := netnstest.WaitPortIn(ctx, l.lan, "tcp", etcdAddr); err != nil {
		l.t.Fatalf("etcd did not start: %v\n%s", err, log)
	}
}

// etcdClient returns a client of the lab's etcd whose connections are made inside the
// LAN namespace.
func (l *lab) etcdClient() *clientv3.Client {
	l.t.Helper()
	dial := dialIn(l.lan, 2*time.Second)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + etcdAddr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		})},
	})
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { cli.Close() })
	return cli
}

// start runs `controlplane-bootstrap vip` in h's namespace with session TTL ttl.
func (l *lab) start(h *vipHost, ttl string) {
	l.t.Helper()
	h.proc = l.env.Command(h.ns, l.bin, "vip", "--address", vipCIDR, "--interface", h.link.Name,
		"--etcd", "http://"+etcdAddr, "--name", h.name, "--ttl", ttl)
	h.log = &syncBuffer{}
	h.proc.Stdout, h.proc.Stderr = h.log, h.log
	if err := h.proc.Start(); err != nil {
		l.t.Fatal(err)
	}
	h.exited = make(chan struct{})
	go func() { h.proc.Wait(); h.exitAt = time.Now(); close(h.exited) }()
	l.t.Cleanup(func() { l.t.Logf("log of %s's vip process:\n%s", h.name, h.log) })
}

// holders returns the hosts whose link has the VIP (from `ip -n NS addr`), but not
// those in except.
func (l *lab) holders(except ...*vipHost) []*vipHost {
	l.t.Helper()
	var held []*vipHost
	for _, h := range l.hosts {
		out, err := exec.Command("ip", "-n", h.ns, "-4", "-o", "addr", "show", "dev", h.link.Name).CombinedOutput()
		if err != nil {
			l.t.Fatalf("ip -n %s addr: %v\n%s", h.ns, err, out)
		}
		if strings.Contains(string(out), " "+vipCIDR+" ") && !slices.Contains(except, h) {
			held = append(held, h)
		}
	}
	return held
}

// names returns the hosts' names, for messages.
func names(hosts []*vipHost) []string {
	var n []string
	for _, h := range hosts {
		n = append(n, h.name)
	}
	return n
}

// waitHolder waits until exactly one host other than those in except holds the VIP
// and returns it. limit is a hang detector, not a speed requirement.
func (l *lab) waitHolder(limit time.Duration, except ...*vipHost) *vipHost {
	l.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		held := l.holders(except...)
		if len(held) == 1 {
			return held[0]
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("after %v, the hosts holding %s (not counting %v) are %v; want exactly one", limit, vipCIDR, names(except), names(held))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get asks the VIP, from the client namespace, which host answers.
func (l *lab) get() (string, error) {
	resp, err := l.http.Get(vipURL)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// waitAnswer polls the VIP from the client namespace until host want answers, and
// returns when it first did. limit is a hang detector.
func (l *lab) waitAnswer(want string, limit time.Duration) time.Time {
	l.t.Helper()
	deadline := time.Now().Add(limit)
	var got string
	var err error
	for {
		got, err = l.get()
		if err == nil && got == want {
			return time.Now()
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("after %v, %s from the client answers %q, %v; want %s", limit, vipURL, got, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leader returns vip.Leader's answer from the lab's etcd.
func (l *lab) leader() string {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(l.t.Context(), 10*time.Second)
	defer cancel()
	name, err := vip.Leader(ctx, l.etcd, netip.MustParsePrefix(vipCIDR))
	if err != nil {
		l.t.Fatal(err)
	}
	return name
}

// signal sends sig to h's vip process.
func (l *lab) signal(h *vipHost, sig syscall.Signal) {
	l.t.Helper()
	if err := h.proc.Process.Signal(sig); err != nil {
		l.t.Fatalf("signal %v to %s's vip process: %v", sig, h.name, err)
	}
}

// waitExit waits (up to limit, a hang detector) for h's vip process to exit.
func (l *lab) waitExit(h *vipHost, limit time.Duration) {
	l.t.Helper()
	select {
	case <-h.exited:
	case <-time.After(limit):
		l.t.Fatalf("%s's vip process still runs %v after it was signalled", h.name, limit)
	}
}

// mac returns the hardware address of link.
func (l *lab) mac(link netnstest.Link) string {
	l.t.Helper()
	var hw string
	if err := netnstest.InNamespace(link.Netns, func() error {
		ifi, err := net.InterfaceByName(link.Name)
		if err == nil {
			hw = ifi.HardwareAddr.String()
		}
		return err
	}); err != nil {
		l.t.Fatal(err)
	}
	return hw
}

// clientNeighbour returns the hardware address in the client's neighbour (ARP)
// entry for the VIP, and the entry's whole line.
func (l *lab) clientNeighbour() (string, string) {
	l.t.Helper()
	out, err := exec.Command("ip", "-n", l.client, "neigh", "show", "to", strings.TrimSuffix(vipCIDR, "/24"), "dev", l.clink.Name).CombinedOutput()
	if err != nil {
		l.t.Fatalf("ip -n %s neigh: %v\n%s", l.client, err, out)
	}
	fields := strings.Fields(string(out))
	if i := slices.Index(fields, "lladdr"); i >= 0 && i+1 < len(fields) {
		return fields[i+1], strings.TrimSpace(string(out))
	}
	return "", strings.TrimSpace(string(out))
}

// ipRun runs ip with args and fails the test if it fails.
func (l *lab) ipRun(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// syncBuffer is a bytes.Buffer that a process's output and the test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// defaultTTL is the --ttl of the failover tests: the command's default.
const defaultTTL = 5 * time.Second

// TestExactlyOneHolderAnswers starts the vip process on three hosts and checks that
// exactly one of them adds the VIP, that the client reaches that host through the
// VIP, and that Leader names it.
func TestExactlyOneHolderAnswers(t *testing.T) {
	l := newLab(t)
	if name := l.leader(); name != "" {
		t.Fatalf("Leader before any host campaigned = %q, want \"\"", name)
	}
	for _, h := range l.hosts {
		l.start(h, defaultTTL.String())
	}
	holder := l.waitHolder(15 * time.Second)
	l.waitAnswer(holder.name, 15*time.Second)
	if held := l.holders(); len(held) != 1 || held[0] != holder {
		t.Errorf("after the client was answered, the holders are %v; want only %s", names(held), holder.name)
	}
	if name := l.leader(); name != holder.name {
		t.Errorf("Leader = %q; %s holds the VIP", name, holder.name)
	}
	if !strings.Contains(holder.log.String(), "took the API address") {
		t.Errorf("%s holds the VIP but did not log \"took the API address\"", holder.name)
	}
}

// TestFailoverWhenHolderHostIsLost makes the holder disappear as a lost host would:
// its vip process is killed with SIGKILL, so it neither deletes the VIP nor resigns,
// and its link goes down, so it no longer answers. Another host must take the VIP
// once the lost holder's lease expires, and the client must reach it through the VIP
// at once: the new holder's gratuitous ARP updates the client's ARP cache entry.
func TestFailoverWhenHolderHostIsLost(t *testing.T) {
	l := newLab(t)
	for _, h := range l.hosts {
		l.start(h, defaultTTL.String())
	}
	old := l.waitHolder(15 * time.Second)
	l.waitAnswer(old.name, 15*time.Second) // the client's ARP cache now names old

	lost := time.Now()
	l.signal(old, syscall.SIGKILL)
	l.waitExit(old, 10*time.Second)
	l.ipRun("-n", old.ns, "link", "set", "dev", old.link.Name, "down")
	limit := defaultTTL + 10*time.Second
	successor := l.waitHolder(limit, old)
	took := time.Since(lost)
	answered := l.waitAnswer(successor.name, limit-took)
	if name := l.leader(); name != successor.name {
		t.Errorf("Leader = %q; %s holds the VIP", name, successor.name)
	}
	// The client's entry named old's address and was confirmed just before the
	// kill. Linux keeps such an entry reachable for at least 15s (half of
	// base_reachable_time), then waits 5s and probes for 3s before it asks anew by
	// broadcast, which is longer than limit: only the successor's gratuitous ARP can
	// have changed it in time.
	if hw, line := l.clientNeighbour(); hw != l.mac(successor.link) {
		t.Errorf("the client's neighbour entry for the VIP is %q; want %s's address %s", line, successor.name, l.mac(successor.link))
	}
	t.Logf("figure: failover after the holder's host was lost (vip process SIGKILLed and its link set down; --ttl %v; three holders and a client on one Linux bridge, etcd with one member): "+
		"%s took the VIP %v after the kill, and the client's requests to the VIP reached it %v after the kill",
		defaultTTL, successor.name, took.Round(time.Millisecond), answered.Sub(lost).Round(time.Millisecond))
}

// TestCleanHandover stops the holder with SIGTERM: it must delete the VIP, resign
// and revoke its lease, so that another host takes the VIP without waiting for the
// TTL. The TTL here is long (20s) and the limit half of it, so passing shows that
// nobody waited for the lease to expire.
func TestCleanHandover(t *testing.T) {
	const ttl = 20 * time.Second
	l := newLab(t)
	for _, h := range l.hosts {
		l.start(h, ttl.String())
	}
	old := l.waitHolder(15 * time.Second)
	l.waitAnswer(old.name, 15*time.Second)

	stopped := time.Now()
	l.signal(old, syscall.SIGTERM)
	successor := l.waitHolder(ttl/2, old)
	took := time.Since(stopped)
	answered := l.waitAnswer(successor.name, ttl/2)
	l.waitExit(old, 10*time.Second)
	exited := old.exitAt.Sub(stopped)
	if !old.proc.ProcessState.Success() {
		t.Errorf("%s's vip process exited with %v after SIGTERM; want status 0", old.name, old.proc.ProcessState)
	}
	if held := l.holders(); slices.Contains(held, old) {
		t.Errorf("%s's vip process exited after SIGTERM but %s still has %s", old.name, old.name, vipCIDR)
	}
	if name := l.leader(); name != successor.name {
		t.Errorf("Leader = %q; %s holds the VIP", name, successor.name)
	}
	if !strings.Contains(old.log.String(), "released the API address") {
		t.Errorf("%s did not log \"released the API address\"", old.name)
	}
	t.Logf("figure: clean handover (holder's vip process got SIGTERM; --ttl %v; three holders on one Linux bridge, etcd with one member): "+
		"%s took the VIP %v after the signal, the client reached it %v after the signal, and the old holder's process exited %v after the signal",
		ttl, successor.name, took.Round(time.Millisecond), answered.Sub(stopped).Round(time.Millisecond), exited.Round(time.Millisecond))
}

// TestRestartedHolderCleansUp puts the VIP by hand on a host's link, as a vip process
// killed while holding it would have left it, and starts that host's vip process
// while another host holds the VIP: the process must delete the stale address and
// leave the holder alone.
func TestRestartedHolderCleansUp(t *testing.T) {
	l := newLab(t)
	l.start(l.hosts[0], defaultTTL.String())
	l.start(l.hosts[1], defaultTTL.String())
	holder := l.waitHolder(15 * time.Second)
	stale := l.hosts[2]
	l.ipRun("-n", stale.ns, "addr", "add", vipCIDR, "dev", stale.link.Name)
	if held := l.holders(); len(held) != 2 {
		t.Fatalf("after adding %s to %s by hand, the holders are %v; want %s and %s", vipCIDR, stale.name, names(held), holder.name, stale.name)
	}
	started := time.Now()
	l.start(stale, defaultTTL.String())
	deadline := started.Add(15 * time.Second)
	for slices.Contains(l.holders(), stale) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's vip process has run for 15s and %s still has the stale %s", stale.name, stale.name, vipCIDR)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s deleted its stale address %v after its vip process started", stale.name, time.Since(started).Round(time.Millisecond))
	if !strings.Contains(stale.log.String(), "deleted the API address left on the interface by an earlier run") {
		t.Errorf("%s did not log deleting the stale address", stale.name)
	}
	time.Sleep(time.Second) // time for a wrong takeover to show
	if held := l.holders(); len(held) != 1 || held[0] != holder {
		t.Errorf("the holders are %v; want only %s, which held the VIP before", names(held), holder.name)
	}
	if name := l.leader(); name != holder.name {
		t.Errorf("Leader = %q; %s holds the VIP", name, holder.name)
	}
}

// TestValidate checks that Validate accepts good configurations and that each bad one
// gets an error naming the field at fault.
func TestValidate(t *testing.T) {
	good := func(edit func(*vip.Config)) vip.Config {
		c := vip.Config{Address: netip.MustParsePrefix("10.0.0.10/24"), Interface: "eth0", Endpoints: []string{"http://10.0.0.11:2379"}}
		if edit != nil {
			edit(&c)
		}
		return c
	}
	withTLS := func(c *vip.Config) { c.TLS = &tls.Config{} }
	for _, tc := range []struct {
		name string
		cfg  vip.Config
		want []string // substrings of the error; none: valid
	}{
		{"minimal", good(nil), nil},
		{"full", good(func(c *vip.Config) {
			withTLS(c)
			c.Endpoints = []string{"https://10.0.0.11:2379", "https://10.0.0.12:2379"}
			c.Name, c.TTL, c.Address = "cp1", 3*time.Second, netip.MustParsePrefix("192.0.2.7/32")
		}), nil},
		{"no address", good(func(c *vip.Config) { c.Address = netip.Prefix{} }), []string{"vip: Address: not set"}},
		{"IPv6", good(func(c *vip.Config) { c.Address = netip.MustParsePrefix("2001:db8::10/64") }), []string{"Address 2001:db8::10/64", "IPv6 is not supported yet", "NDP"}},
		{"IPv4-mapped IPv6", good(func(c *vip.Config) { c.Address = netip.MustParsePrefix("::ffff:10.0.0.10/120") }), []string{"Address", "IPv6 is not supported yet"}},
		{"network address", good(func(c *vip.Config) { c.Address = netip.MustParsePrefix("10.0.0.0/24") }), []string{"Address 10.0.0.0/24", "network address"}},
		{"multicast", good(func(c *vip.Config) { c.Address = netip.MustParsePrefix("224.0.0.18/4") }), []string{"Address 224.0.0.18/4", "not a unicast address"}},
		{"unspecified", good(func(c *vip.Config) { c.Address = netip.MustParsePrefix("0.0.0.0/32") }), []string{"Address 0.0.0.0/32"}},
		{"no interface", good(func(c *vip.Config) { c.Interface = "" }), []string{"vip: Interface: not set"}},
		{"long interface", good(func(c *vip.Config) { c.Interface = "a-very-long-link0" }), []string{`Interface "a-very-long-link0"`, "15 bytes"}},
		{"no endpoints", good(func(c *vip.Config) { c.Endpoints = nil }), []string{"vip: Endpoints: none"}},
		{"endpoint not a URL", good(func(c *vip.Config) { c.Endpoints = []string{"10.0.0.11:2379"} }), []string{`Endpoints: "10.0.0.11:2379" is not an etcd client URL`}},
		{"https without TLS", good(func(c *vip.Config) { c.Endpoints = []string{"https://10.0.0.11:2379"} }), []string{"Endpoints: https://10.0.0.11:2379 is https but TLS is not set"}},
		{"http with TLS", good(withTLS), []string{"Endpoints: http://10.0.0.11:2379 is plain http but TLS is set"}},
		{"TTL under a second", good(func(c *vip.Config) { c.TTL = 500 * time.Millisecond }), []string{"TTL 500ms: less than 1s"}},
		{"negative TTL", good(func(c *vip.Config) { c.TTL = -time.Second }), []string{"TTL -1s: less than 1s"}},
		{"fractional TTL", good(func(c *vip.Config) { c.TTL = 1500 * time.Millisecond }), []string{"TTL 1.5s: not whole seconds"}},
		{"everything missing", vip.Config{}, []string{"Address", "Interface", "Endpoints"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestRunRefusesAtOnce checks that Run returns an error, without waiting for etcd,
// when the configuration is bad or the interface does not exist.
func TestRunRefusesAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cfg := vip.Config{Address: netip.MustParsePrefix("10.0.0.10/24"), Interface: "gpr-nosuchlink", Endpoints: []string{"http://192.0.2.1:2379"}}
	if err := vip.Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "Interface gpr-nosuchlink") {
		t.Errorf("Run with a missing interface = %v, want an error naming Interface gpr-nosuchlink", err)
	}
	cfg.Endpoints = nil
	if err := vip.Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "Endpoints") {
		t.Errorf("Run without endpoints = %v, want an error naming Endpoints", err)
	}
}

// TestEtcdLostReleasesAndRecovers stops etcd (SIGSTOP), so that every host's session
// is lost: the holder must delete the VIP, and once etcd runs again (SIGCONT) the
// hosts must campaign again with new sessions and one must take the VIP.
func TestEtcdLostReleasesAndRecovers(t *testing.T) {
	l := newLab(t)
	for _, h := range l.hosts {
		l.start(h, defaultTTL.String())
	}
	old := l.waitHolder(15 * time.Second)
	l.waitAnswer(old.name, 15*time.Second)

	stopped := time.Now()
	if err := l.etcdP.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			l.etcdP.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	deadline := stopped.Add(defaultTTL + 10*time.Second)
	for len(l.holders()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("etcd has been stopped for %v and %v still hold the VIP", time.Since(stopped).Round(time.Second), names(l.holders()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	released := time.Since(stopped)
	if !strings.Contains(old.log.String(), "the etcd session was lost") {
		t.Errorf("%s released the VIP without logging that its etcd session was lost", old.name)
	}
	time.Sleep(2 * time.Second) // the hosts retry against a stopped etcd
	resume()
	again := time.Now()
	holder := l.waitHolder(30 * time.Second)
	took := time.Since(again)
	l.waitAnswer(holder.name, 15*time.Second)
	if name := l.leader(); name != holder.name {
		t.Errorf("Leader = %q; %s holds the VIP", name, holder.name)
	}
	t.Logf("etcd stopped: %s released the VIP %v later (--ttl %v); etcd resumed: %s took it %v later",
		old.name, released.Round(time.Millisecond), defaultTTL, holder.name, took.Round(time.Millisecond))
}

//go:build linux

// Package cphosts tests three control-plane hosts, each in its own network namespace on
// one bridge, behind the floating API address (issue 31, part 4: losing the etcd
// leader).
package cphosts

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/cpbbin"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/test/runbooks"
)

// The lab's addresses: one /24 on one bridge; host i is .1i, the API's floating
// address .10, the client .20.
const (
	subnet    = "10.214.0"
	vipAddr   = subnet + ".10"
	apiPort   = 6443
	nWrites   = 1000
	killAt    = 200 // the leader's host is killed once this many writes are acknowledged
	maxOut    = 15 * time.Second
	k8sReqEnv = "GPURACK_K8S_REQUIRED"
)

// host is one control-plane host: its namespace, directory and controlplane-bootstrap
// process (init or join, in the foreground).
type host struct {
	name, ns, dir, config string
	proc                  *exec.Cmd
	log                   *syncBuffer
}

type lab struct {
	t      *testing.T
	env    *netnstest.Env
	bin    string
	client string
	hosts  []*host
}

// TestEtcdLeaderLoss: three hosts join through upload-certs and join --control-plane,
// with leader election and the VIP on. A writer creates 1000 ConfigMaps through the
// VIP, one at a time, retrying each until it is acknowledged; after 200, every process
// in the etcd leader's namespace is killed with SIGKILL. The API answers again through
// the VIP within 15 s, the writer finishes, every acknowledged ConfigMap is there, and
// the killed host, started again on its directory, is a healthy member again.
func TestEtcdLeaderLoss(t *testing.T) {
	l := newLab(t)
	l.startFirst()
	joinArgs := l.uploadCerts()
	l.join(l.hosts[1], joinArgs)
	l.join(l.hosts[2], joinArgs)
	cs := l.clientThroughVIP()
	leader := l.leader()
	t.Logf("three hosts up; etcd leader %s", leader.name)

	acked := make(chan string, nWrites)
	reachedKill := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() { writerDone <- write(t.Context(), cs, acked, reachedKill) }()
	<-reachedKill
	killed := time.Now()
	l.killAll(leader)
	moved := make(chan string, 1)
	go func() { moved <- l.vipMoved(leader, killed) }()
	back, lastErr := l.waitAPI(cs, killed)
	t.Logf("killed every process in %s's namespace (the etcd leader); %s; the API answered through %s again after %s (the last error before: %v)",
		leader.name, <-moved, vipAddr, back.Round(10*time.Millisecond), lastErr)
	if back > maxOut {
		t.Errorf("the API answered through the VIP %s after the leader's loss; want within %s", back.Round(10*time.Millisecond), maxOut)
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	close(acked)
	l.checkAcked(cs, acked)

	l.restart(leader)
	l.waitMembers(3)

	l.replace(l.hosts[2])
	l.waitMembers(3)
}

// replace loses h for good (its processes killed, its directory gone, as with a dead
// disk) and replaces it by running docs/ha.md's runbook "replace-control-plane-host"
// as written: its blocks, read from the page, run with bash in the first host's
// namespace (/var/lib/gpurack/cp standing for its directory), except the join, which
// runs as the test's stand-in on h (in the foreground, with the arguments the page's
// upload-certs step printed): a new machine of the same name and address.
func (l *lab) replace(h *host) {
	l.t.Helper()
	l.killAll(h)
	if err := os.RemoveAll(h.dir); err != nil {
		l.t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("..", "..", haDoc))
	if err != nil {
		l.t.Fatal(err)
	}
	rbs, err := runbooks.Parse(string(data))
	if err != nil {
		l.t.Fatalf("%s: %v", haDoc, err)
	}
	i := slices.IndexFunc(rbs, func(rb runbooks.Runbook) bool { return rb.Name == "replace-control-plane-host" })
	if i < 0 {
		l.t.Fatalf("%s tags no runbook replace-control-plane-host", haDoc)
	}
	etcdctl, err := components.FindBinary(components.BinDir(""), "etcdctl")
	if err != nil {
		l.t.Fatal(err)
	}
	first := l.hosts[0]
	prelude := "export PATH=" + filepath.Dir(l.bin) + ":" + filepath.Dir(etcdctl) + ":$PATH"
	values := map[string]string{"LOST": h.name}
	for _, st := range rbs[i].Steps {
		if st.Instead == "join-in-the-foreground" {
			l.join(h, append([]string{"join", "--control-plane"}, strings.Fields(values["JOIN"])...))
			continue
		}
		text := strings.ReplaceAll(runbooks.Substitute(st.Text, values, shellQuote), "/var/lib/gpurack/cp", first.dir)
		maps.Copy(values, l.runStep(first, st, prelude, text, values))
	}
	l.t.Logf("%s lost for good (member %s removed with etcdctl) and replaced by a new machine, as %s says", h.name, values["ID"], haDoc)
}

// haDoc is the page whose replacement runbook replace runs.
const haDoc = "docs/ha.md"

// runStep runs one step of the page in h's namespace until its expectations hold (once,
// or until its retry= has passed) and returns what it captured.
func (l *lab) runStep(h *host, st runbooks.Step, prelude, text string, values map[string]string) map[string]string {
	l.t.Helper()
	deadline := time.Now().Add(st.Retry)
	for {
		out, err := l.env.Run(h.ns, "bash", "-c", runbooks.Script(haDoc, st, prelude, text))
		exit := 0
		if err != nil {
			exit = 1
		}
		problems, captured := runbooks.Judge(haDoc, st, out, exit, values)
		if len(problems) == 0 {
			return captured
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("%s:%d, as written:\n%s\n%s\n%s", haDoc, st.Line, text, strings.Join(problems, "\n"), out)
		}
		time.Sleep(time.Second)
	}
}

// shellQuote quotes a value for bash.
func shellQuote(v string) string { return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'" }

func newLab(t *testing.T) *lab {
	t.Helper()
	if _, err := components.FindBinary(components.BinDir(""), "etcd"); err != nil {
		testreq.Missing(t, "the pinned Kubernetes binaries are not here: "+err.Error(), "run `make k8s-bins`", k8sReqEnv)
	}
	l := &lab{t: t, env: netnstest.New(t), bin: cpbbin.Path(t)}
	lan := l.env.Namespace()
	br := l.env.Bridge(lan)
	l.env.AddAddr(br, subnet+".1/24")
	join := func(ns, cidr string) netnstest.Link {
		lanEnd, nsEnd := l.env.Veth(lan, ns)
		l.env.Attach(br, lanEnd)
		l.env.AddAddr(nsEnd, cidr)
		return nsEnd
	}
	work := t.TempDir()
	for i := 1; i <= 3; i++ {
		h := &host{name: fmt.Sprintf("cp-%d", i), ns: l.env.Namespace(), dir: filepath.Join(work, fmt.Sprintf("cp-%d", i))}
		link := join(h.ns, fmt.Sprintf("%s.1%d/24", subnet, i))
		h.config = writeConfig(t, work, i, link.Name)
		l.hosts = append(l.hosts, h)
	}
	l.client = l.env.Namespace()
	join(l.client, subnet+".20/24")
	return l
}

// writeConfig writes host i's cluster.yaml: its own address, the VIP on link, three
// hosts, etcd without fsync (the hosts are killed, not powered off).
func writeConfig(t *testing.T, work string, i int, link string) string {
	t.Helper()
	cfg := clusterconfig.Default()
	cfg.NodeName, cfg.ControlPlane.Hosts = fmt.Sprintf("cp-%d", i), 3
	cfg.APIServer.AdvertiseAddress, cfg.APIServer.BindAddress = fmt.Sprintf("%s.1%d", subnet, i), "0.0.0.0"
	cfg.APIServer.VIP = clusterconfig.VIP{Address: vipAddr + "/24", Interface: link, TTL: 5 * time.Second}
	cfg.Etcd.ExtraArgs = map[string]string{"unsafe-no-fsync": "true"}
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(work, fmt.Sprintf("cp-%d.yaml", i))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := clusterconfig.Parse(p, data); err != nil {
		t.Fatalf("host %d's configuration: %v", i, err)
	}
	return p
}

// start runs controlplane-bootstrap args in h's namespace and waits for "ready in".
func (l *lab) start(h *host, args ...string) {
	l.t.Helper()
	h.proc = l.env.Command(h.ns, l.bin, args...)
	h.log = &syncBuffer{}
	pr, pw := io.Pipe()
	h.proc.Stdout, h.proc.Stderr = pw, pw
	if err := h.proc.Start(); err != nil {
		l.t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			h.log.Write([]byte(sc.Text() + "\n"))
			if strings.HasPrefix(sc.Text(), "ready in ") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	exited := make(chan struct{})
	go func() { h.proc.Wait(); pw.Close(); close(exited) }()
	l.t.Cleanup(func() {
		if l.t.Failed() {
			l.t.Logf("%s's %s output:\n%s", h.name, args[0], h.log)
		}
	})
	select {
	case <-ready:
	case <-exited:
		l.t.Fatalf("%s: %s exited before it was ready:\n%s", h.name, args[0], h.log)
	case <-time.After(4 * time.Minute):
		l.t.Fatalf("%s: %s not ready after 4 minutes:\n%s", h.name, args[0], h.log)
	}
}

func (l *lab) startFirst() {
	h := l.hosts[0]
	l.start(h, "init", "--foreground", "--config", h.config, "--dir", h.dir)
}

// uploadCerts runs upload-certs on the first host and returns the join arguments.
func (l *lab) uploadCerts() []string {
	l.t.Helper()
	out, err := l.env.Run(l.hosts[0].ns, l.bin, "upload-certs", "--dir", l.hosts[0].dir)
	if err != nil {
		l.t.Fatalf("upload-certs: %v", err)
	}
	m := regexp.MustCompile(`controlplane-bootstrap (join --control-plane --server \S+ --token \S+ --ca-cert-hash \S+ --certificate-key \S+)`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(m[1], "--server "+vipAddr+":") {
		l.t.Fatalf("upload-certs printed no join command through the VIP:\n%s", out)
	}
	return strings.Fields(m[1])
}

func (l *lab) join(h *host, args []string) {
	l.start(h, append(args, "--config", h.config, "--dir", h.dir, "--foreground")...)
}

// restart starts h again on its directory, as its supervisor would after a reboot.
func (l *lab) restart(h *host) { l.start(h, "init", "--foreground", "--dir", h.dir) }

// status runs status on the first live host other than except.
func (l *lab) status(except *host) string {
	l.t.Helper()
	for _, h := range l.hosts {
		if h == except {
			continue
		}
		if out, err := l.env.Run(h.ns, l.bin, "status", "--dir", h.dir); err == nil || strings.Contains(out, "etcd:") {
			return out
		}
	}
	return ""
}

// leader is the host whose member etcd names leader.
func (l *lab) leader() *host {
	l.t.Helper()
	var m []string
	out := ""
	for start := time.Now(); m == nil && time.Since(start) < 30*time.Second; time.Sleep(time.Second) {
		out = l.status(nil)
		m = regexp.MustCompile(`etcd: 3 member\(s\), leader (cp-\d)`).FindStringSubmatch(out)
	}
	if m == nil {
		l.t.Fatalf("no etcd leader of 3 members in status for 30 s:\n%s", out)
	}
	for _, h := range l.hosts {
		if h.name == m[1] {
			return h
		}
	}
	l.t.Fatalf("leader %s is none of the hosts", m[1])
	return nil
}

// killAll sends SIGKILL to every process in h's namespace: its supervisor, etcd, the
// API server, the controller-manager, the scheduler and the VIP's holder.
func (l *lab) killAll(h *host) {
	l.t.Helper()
	out, err := exec.Command("ip", "netns", "pids", h.ns).Output()
	if err != nil {
		l.t.Fatalf("ip netns pids %s: %v", h.ns, err)
	}
	n := 0
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	if n < 5 {
		l.t.Errorf("killed %d processes in %s's namespace; want its supervisor and at least etcd, the API server, the controller-manager and the scheduler", n, h.name)
	}
}

// clientThroughVIP is an admin client whose connections go from the client namespace
// to the VIP.
func (l *lab) clientThroughVIP() kubernetes.Interface {
	l.t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(l.hosts[0].dir, "admin.conf"))
	if err != nil {
		l.t.Fatal(err)
	}
	rc.Host = fmt.Sprintf("https://%s:%d", vipAddr, apiPort)
	rc.Timeout = 3 * time.Second
	rc.QPS, rc.Burst = 500, 500
	rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := netnstest.InNamespace(l.client, func() error {
			var err error
			conn, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		l.t.Fatal(err)
	}
	return cs
}

// write creates nWrites ConfigMaps in order, each retried until the API acknowledges
// it (or says it exists: an earlier try was applied but its answer lost), sending each
// acknowledged name on acked and closing reachedKill after killAt.
func write(ctx context.Context, cs kubernetes.Interface, acked chan<- string, reachedKill chan<- struct{}) error {
	deadline := time.Now().Add(3 * time.Minute)
	for i := range nWrites {
		name := fmt.Sprintf("w-%04d", i)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
		for {
			_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				if err == nil {
					acked <- name
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("write %s: still failing 3 minutes after the writer started: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if i+1 == killAt {
			close(reachedKill)
		}
	}
	return nil
}

// waitAPI waits until a write through the VIP is acknowledged (a ConfigMap created),
// and returns how long after since, with the last error before it. A write, not a list:
// a list is served from the API server's watch cache once that has caught up with
// etcd's new leader, which can take seconds longer than the first write.
func (l *lab) waitAPI(cs kubernetes.Interface, since time.Time) (time.Duration, error) {
	l.t.Helper()
	var last error
	for try := 0; time.Since(since) < 2*time.Minute; try++ {
		ctx, cancel := context.WithTimeout(l.t.Context(), 2*time.Second)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", try), Namespace: "kube-public"}}
		_, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
		cancel()
		if err == nil {
			return time.Since(since), last
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	l.t.Fatalf("the API did not answer through %s for 2 minutes after the leader's loss (last: %v)", vipAddr, last)
	return 0, nil
}

// vipMoved says when the VIP appeared on another host than lost, after since.
func (l *lab) vipMoved(lost *host, since time.Time) string {
	for time.Since(since) < time.Minute {
		for _, h := range l.hosts {
			if h == lost {
				continue
			}
			if out, err := exec.Command("ip", "-n", h.ns, "-4", "addr").Output(); err == nil && strings.Contains(string(out), vipAddr+"/") {
				return fmt.Sprintf("the VIP on %s after %s", h.name, time.Since(since).Round(10*time.Millisecond))
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "the VIP on no other host within a minute"
}

// checkAcked fails for every acknowledged ConfigMap that is not there.
func (l *lab) checkAcked(cs kubernetes.Interface, acked <-chan string) {
	l.t.Helper()
	list, err := cs.CoreV1().ConfigMaps("default").List(l.t.Context(), metav1.ListOptions{})
	if err != nil {
		l.t.Fatal(err)
	}
	have := map[string]bool{}
	for _, cm := range list.Items {
		have[cm.Name] = true
	}
	n, missing := 0, 0
	for name := range acked {
		n++
		if !have[name] {
			missing++
			l.t.Errorf("ConfigMap %s was acknowledged but is gone", name)
		}
	}
	l.t.Logf("%d ConfigMaps acknowledged of %d written, %d missing after the leader's loss", n, nWrites, missing)
	if n < nWrites-10 {
		l.t.Errorf("only %d creates were acknowledged (the rest found their object already there); want nearly all %d", n, nWrites)
	}
}

// waitMembers waits until status shows n healthy voting members.
func (l *lab) waitMembers(n int) {
	l.t.Helper()
	out := ""
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(time.Second) {
		out = l.status(nil)
		if strings.Contains(out, fmt.Sprintf("etcd: %d member(s)", n)) && strings.Count(out, " healthy ") == n && !strings.Contains(out, "learner") {
			l.t.Logf("%d healthy voting members", n)
			return
		}
	}
	l.t.Errorf("not %d healthy voting members a minute after the host started:\n%s", n, out)
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestMain(m *testing.M) {
	code := m.Run()
	cpbbin.Remove()
	os.Exit(code)
}

package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// The services a node runs once kubelet has joined are declared in one list
// (postJoinServices): each with what it waits for, what it makes happen for the others
// and how it is restarted. One supervisor (supervised) starts them in the node's
// Services, restarts them and reports them. A new node service goes in that list.

// gate is something post-join services wait for; one of them, or the join, opens it.
type gate string

// The gates.
const (
	// kubeletJoined: kubelet runs with its node kubeconfig and the Node exists. The
	// join opens it; every post-join service starts after it.
	kubeletJoined gate = "kubelet joined"
	// kubeProxySynced: kube-proxy has put its Service rules in place. The pod network
	// waits for it before it writes the CNI conflist that lets kubelet report Ready,
	// so that a Ready node's pods reach Services from their first packet.
	kubeProxySynced gate = "kube-proxy synced"
)

// serviceRestart is the backoff between attempts to bring up a node service that keeps
// failing until something outside it changes (the pod network, NetworkPolicy): an
// apiserver not answering, a kernel module still loading, a named error an operator
// must fix.
var serviceRestart = retry.Backoff{First: 5 * time.Second, Max: time.Minute}

// postJoinService is one entry of the declared list.
type postJoinService struct {
	svc attempter
	// what names it in the log and on the console ("pod network").
	what string
	// startAfter is opened before its first attempt; upAfter, when set, it waits for
	// (through gated.wait) before it says it is up; opens it opens once it is up.
	startAfter, upAfter, opens gate
	// restart is the backoff between its attempts; zero First: it is not restarted,
	// and its first failure is final.
	restart retry.Backoff
}

// attempter is a post-join service's side of the supervisor.
type attempter interface {
	Name() string
	Status() ServiceStatus
	set(state ServiceState, msg string)
	// attempt runs the service once: until ctx ends (nil), or it fails. g waits for
	// and opens the gates its declaration names.
	attempt(ctx context.Context, g gated) error
}

// gated is what a service's attempt sees of the gates.
type gated struct {
	// wait returns once the service's upAfter gate is open (at once when it has
	// none), or with ctx's error.
	wait func(ctx context.Context) error
	// open opens the service's opens gate (nothing when it has none).
	open func()
}

// postJoinServices declares the services that start once kubelet has joined:
//
//	kube-proxy      after kubelet joined; opens kube-proxy synced; restarted 1 s doubling to 30 s (no nftables: final)
//	pod-network     after kubelet joined; up after kube-proxy synced; restarted 5 s doubling to 1 min
//	network-policy  after kubelet joined; restarted 5 s doubling to 1 min
//	device-plugin   after kubelet joined (unless it runs since the start); not restarted
//	data-disks      after kubelet joined; restarted 5 s doubling to 1 min (datadisks.go)
//	local-volumes   after kubelet joined; restarted 5 s doubling to 1 min (localvolumes.go)
//	shared-volumes  after kubelet joined; restarted 5 s doubling to 1 min (sharedvolumes.go);
//	                idle without a gpurack-shared class; provisions while elected
//	node-exporter   after kubelet joined; restarted 5 s doubling to 1 min (metrics.go);
//	                not with --node-exporter-listen off; no cluster CA in the bundle: failed
//	log-shipping    after kubelet joined; restarted 5 s doubling to 1 min (logs.go); only
//	                when the bundle names a logs endpoint
//	registry-hosts  after kubelet joined; restarted 5 s doubling to 1 min (registry.go);
//	                writes the bundle's registry's hosts.toml, or removes stale ones
//
// Pod network settings the bundle gets wrong leave a failed pod-network, and no
// kube-proxy (it needs the pod subnet): the Node stays NotReady and says why.
func (n *node) postJoinServices(bundle *bootv1.JoinBundle) []postJoinService {
	name := bundle.GetNodeName()
	kubeconfig := kubeletPaths(n.cfg.KubeletDir).Kubeconfig
	var list []postJoinService
	if pn, err := n.podNetworkSettings(bundle); err != nil {
		list = append(list, postJoinService{svc: &failedService{name: "pod-network", what: "pod network", console: n.cfg.Console, err: err},
			startAfter: kubeletJoined})
	} else {
		list = append(list,
			postJoinService{svc: n.kubeProxy(kubeconfig, name, pn.PodSubnet), what: "kube-proxy",
				startAfter: kubeletJoined, opens: kubeProxySynced, restart: joinRetry},
			postJoinService{svc: n.podNetwork(kubeconfig, name, pn), what: "pod network",
				startAfter: kubeletJoined, upAfter: kubeProxySynced, restart: serviceRestart})
	}
	list = append(list, postJoinService{svc: n.networkPolicy(kubeconfig, name), what: "network policy",
		startAfter: kubeletJoined, restart: serviceRestart})
	if !n.cfg.DevicePlugin { // else it runs since the start
		list = append(list, postJoinService{svc: n.devicePlugin(), what: "device plugin", startAfter: kubeletJoined})
	}
	if dd, err := n.dataDisks(bundle, kubeconfig); err != nil {
		list = append(list, postJoinService{svc: &failedService{name: "data-disks", what: "data disks", console: n.cfg.Console, err: err},
			startAfter: kubeletJoined})
	} else {
		list = append(list, postJoinService{svc: dd, what: "data disks", startAfter: kubeletJoined, restart: serviceRestart})
	}
	list = append(list, postJoinService{svc: n.localVolumes(kubeconfig, name), what: "local volumes", startAfter: kubeletJoined, restart: serviceRestart},
		postJoinService{svc: n.sharedVolumes(kubeconfig, name), what: "shared volumes", startAfter: kubeletJoined, restart: serviceRestart})
	switch {
	case n.cfg.NodeExporterListen == "off":
	case bundle.GetClusterCaPem() == "":
		list = append(list, postJoinService{svc: &failedService{name: "node-exporter", what: "node_exporter", console: n.cfg.Console,
			err: errors.New("the JoinBundle carries no cluster CA, which node_exporter's clients must chain to: not started")}, startAfter: kubeletJoined})
	default:
		list = append(list, postJoinService{svc: n.nodeExporter(bundle), what: "node_exporter", startAfter: kubeletJoined, restart: serviceRestart})
	}
	if ls := n.logShipping(bundle); ls != nil {
		list = append(list, postJoinService{svc: ls, what: "log shipping", startAfter: kubeletJoined, restart: serviceRestart})
	}
	list = append(list, postJoinService{svc: n.registryHosts(bundle), what: "registry hosts", startAfter: kubeletJoined, restart: serviceRestart})
	return list
}

// supervise starts the declared services in the node's Services, with opened as the
// gates already open.
func (n *node) supervise(list []postJoinService, opened ...gate) {
	g := newGates()
	for _, o := range opened {
		g.open(o)
	}
	for _, d := range list {
		n.services.Start(&supervised{postJoinService: d, gates: g, log: n.log.With("service", d.svc.Name()), console: n.cfg.Console})
	}
}

// supervised is one declared service under the supervisor: a Service whose Run waits
// for its start gate, then attempts the service and restarts it by its policy, saying
// each failure in its status, the log and on the console.
type supervised struct {
	postJoinService
	gates   *gates
	log     *slog.Logger
	console string
}

func (s *supervised) Name() string          { return s.svc.Name() }
func (s *supervised) Status() ServiceStatus { return s.svc.Status() }

func (s *supervised) Run(ctx context.Context) error {
	if s.gates.wait(ctx, s.startAfter) != nil {
		return nil
	}
	g := gated{wait: func(ctx context.Context) error { return s.gates.wait(ctx, s.upAfter) },
		open: func() { s.gates.open(s.opens) }}
	attempt := func(ctx context.Context) error { return s.svc.attempt(ctx, g) }
	if s.restart.First == 0 {
		return attempt(ctx)
	}
	s.svc.set(Starting, "starting")
	err := s.restart.Do(ctx, attempt, func(f retry.Failure) {
		msg := fmt.Sprintf("failed: %v (trying again in %s)", f.Err, f.Wait)
		s.svc.set(Failed, msg)
		s.log.Error(s.what, "error", f.Err, "retry", f.Wait)
		consoleLine(s.console, "gpuagent: "+s.what+" "+msg)
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// gates are the gates of one supervisor, each closed until opened (once).
type gates struct {
	mu sync.Mutex
	ch map[gate]chan struct{}
}

func newGates() *gates { return &gates{ch: map[gate]chan struct{}{}} }

func (g *gates) get(name gate) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.ch[name]
	if !ok {
		c = make(chan struct{})
		g.ch[name] = c
	}
	return c
}

// open opens name; opening it again, or opening "", does nothing.
func (g *gates) open(name gate) {
	if name == "" {
		return
	}
	c := g.get(name)
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

// wait returns once name is open ("" is), or with ctx's error.
func (g *gates) wait(ctx context.Context, name gate) error {
	if name == "" {
		return nil
	}
	select {
	case <-g.get(name):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

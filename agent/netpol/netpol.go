// Package netpol enforces Kubernetes NetworkPolicy on the node, with
// sigs.k8s.io/kube-network-policies embedded (decision 0624): an nftables table
// sends the first packet of each new connection to or from a local pod that a
// policy selects to a netfilter queue, and the controller, reading pods, namespaces
// and NetworkPolicies from the apiserver, answers accept or drop. Established
// connections and pods no policy selects never leave the kernel.
//
// It runs with kubelet's node credential (system:node:NAME) plus the read-only
// ClusterRole controlplane-bootstrap grants every node (joinconfig.NodePolicyReaderRole).
// It must run in the node's network namespace: the nftables table and the queue
// are that namespace's.
package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

const (
	// Table is the nftables table (family inet) the enforcement keeps.
	Table = "gpurack-network-policies"
	// DefaultQueue is the netfilter queue the first packets go to.
	DefaultQueue = 100
)

// Config is what the enforcement runs with.
type Config struct {
	// Kubeconfig is kubelet's node kubeconfig (its client certificate is rotated by
	// kubelet).
	Kubeconfig string
	NodeName   string
	// Queue is the netfilter queue number; 0: DefaultQueue.
	Queue int
	Log   *slog.Logger
	// Progress, when set, gets what the enforcement is doing; up is true once the
	// rules are in place and the queue is answered.
	Progress func(msg string, up bool)
}

func (c *Config) progress(msg string, up bool) {
	if c.Log != nil {
		c.Log.Info("network policy", "status", msg)
	}
	if c.Progress != nil {
		c.Progress(msg, up)
	}
}

// ErrNoQueue is returned when the kernel cannot queue packets to user space (no
// nfnetlink_queue or nft_queue).
var ErrNoQueue = errors.New("the kernel cannot queue packets to user space: load the nfnetlink_queue and nft_queue modules (the node image's module set lists them)")

// Run enforces NetworkPolicy until ctx ends, then removes its table (connections to
// policy-selected pods are then no longer checked). It returns an error when it
// cannot start; the error names what to fix.
//
// The enforcement fails closed: while the rules are in place and nothing answers
// the queue (the agent stopped without removing them, or is restarting), new
// connections of policy-selected pods are dropped.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	if err := CheckKernel(); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("network policy: node kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.UserAgent = "gpuagent-network-policy"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("network policy: node kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	ctrl, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil, // no AdminNetworkPolicy: an alpha API
		networkpolicy.Config{
			QueueID:     cfg.Queue,
			NodeName:    cfg.NodeName,
			NFTableName: Table,
			// NRI stays on although containerd's NRI is off in the images (absent from
			// 1.6): with it off, v0.8.0 dereferences a nil plugin for every packet
			// whose address is no pod's. Its connection attempt fails once and pod
			// addresses come from the apiserver.
			NetfilterBug1766Fix: NeedsDNSRaceFix(kernelRelease()),
		})
	if err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	cfg.progress("waiting for the apiserver's pods, namespaces and NetworkPolicies (the node's read-only grant "+
		"gpurack:node-policy-reader)", false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		select {
		case err := <-done:
			tick.Stop()
			return ended(ctx, err)
		case <-ctx.Done():
			tick.Stop()
			<-done
			return nil
		case <-tick.C:
		}
		if ok, _ := tableExists(); ok {
			tick.Stop()
			break
		}
	}
	cfg.progress(fmt.Sprintf("enforcing NetworkPolicy (nftables table inet %s, queue %d)", Table, cfg.Queue), true)
	select {
	case err := <-done:
		return ended(ctx, err)
	case <-ctx.Done():
		<-done // it removes its table on the way out
		return nil
	}
}

// ended is Run's answer when the controller returned err: nil when ctx ended (a
// stop), else why it stopped early.
func ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("stopped")
	}
	return fmt.Errorf("network policy: kube-network-policies: %w", err)
}

// tableExists says whether the enforcement's table is in this network namespace.
func tableExists() (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, err
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if t.Name == Table {
			return true, nil
		}
	}
	return false, nil
}

// CheckKernel says whether this kernel can queue packets to user space: it loads
// nfnetlink_queue when that is a module not loaded yet (the images load it at boot),
// then adds and removes a table holding one queue rule in a chain no packet reaches
// (the kernel loads nft_queue for it, or refuses the rule).
func CheckKernel() error {
	const proc = "/proc/net/netfilter/nfnetlink_queue"
	if _, err := os.Stat(proc); err != nil {
		out, merr := exec.Command("modprobe", "nfnetlink_queue").CombinedOutput()
		if _, err := os.Stat(proc); err != nil {
			return fmt.Errorf("%w (no %s; modprobe nfnetlink_queue: %v %s)", ErrNoQueue, proc, merr, strings.TrimSpace(string(out)))
		}
	}
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network policy: nftables: %w", err)
	}
	table := conn.AddTable(&nftables.Table{Name: Table + "-check", Family: nftables.TableFamilyINet})
	chain := conn.AddChain(&nftables.Chain{Name: "check", Table: table})
	conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{&expr.Queue{Num: DefaultQueue, Flag: expr.QueueFlagBypass}}})
	err = conn.Flush()
	conn.DelTable(table)
	conn.Flush()
	if err != nil {
		return fmt.Errorf("%w (a queue rule: %v)", ErrNoQueue, err)
	}
	return nil
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// NeedsDNSRaceFix says whether a kernel of this release needs kube-network-policies'
// workaround for netfilter bug 1766 (a race in conntrack on parallel DNS queries over
// one socket, fixed in 6.12): DNS packets are then judged before conntrack confirms
// them. An unreadable release gets the workaround.
func NeedsDNSRaceFix(release string) bool {
	major, rest, _ := strings.Cut(release, ".")
	minor := rest[:len(rest)-len(strings.TrimLeft(rest, "0123456789"))] // "1" of "1.0-28-amd64", "12" of "12-rc1"
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < 6 || (ma == 6 && mi < 12)
}

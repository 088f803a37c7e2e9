// Package testcluster starts a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler from the pinned
// binaries of `make k8s-bins`) for the tests of other parts: gpuboot's node
// controller, the agent's kubelet join, anything that needs an apiserver with
// bootstrap tokens, CSR auto-approval, NodeRestriction and the enroller
// identity of docs/contracts.md §4.
//
// A control plane takes a few seconds and about 450 MiB, so share one per test
// binary:
//
//	func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		c := testcluster.Shared(t)
//		token := c.JoinToken(t)
//		...
//	}
//
// New starts a private one that t.Cleanup stops. Every control plane listens
// on random free loopback ports in its own temporary directory, so test
// binaries of several packages may run at once. It is not for production:
// etcd runs without fsync.
package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/localvolumes"
	"github.com/gpurack/gpurack/controlplane-bootstrap/logsgateway"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/internal/testreq"
)

// RequiredEnv, set to 1, turns the skip for missing binaries into a failure.
// `make test` installs the binaries and sets GPURACK_NETNS_REQUIRED=1, which
// counts as well, so there the control-plane tests always run.
const RequiredEnv = "GPURACK_K8S_REQUIRED"

// Cluster is a running control plane.
type Cluster struct {
	// Dir is the cluster directory (PKI, kubeconfigs, logs/).
	Dir string
	// AdminKubeconfig authenticates as system:masters.
	AdminKubeconfig string
	// EnrollerKubeconfig authenticates as the enroller (docs/contracts.md §4).
	EnrollerKubeconfig string
	// Server is the apiserver URL, CAPEM the cluster CA certificate and
	// CAPin its kubeadm-style pin (sha256:…).
	Server string
	CAPEM  []byte
	CAPin  string
	Config *clusterconfig.Config

	cp *controlplane.ControlPlane
}

// Require skips t (printing why) unless the pinned binaries are installed;
// with RequiredEnv=1 or GPURACK_NETNS_REQUIRED=1 it fails t instead
// (testreq.Missing decides).
func Require(t testing.TB, extra ...string) {
	t.Helper()
	if reason := missing(extra...); reason != "" {
		testreq.Missing(t, "testcluster: the pinned binaries are not all here", reason, RequiredEnv)
	}
}

func missing(extra ...string) string {
	dir := components.BinDir("")
	for _, name := range append(append([]string{}, components.Names...), extra...) {
		if _, err := components.FindBinary(dir, name); err != nil {
			return err.Error()
		}
	}
	return ""
}

// New starts a private control plane for t and stops and deletes it in
// t.Cleanup.
func New(t testing.TB) *Cluster {
	t.Helper()
	return NewWith(t, Options{})
}

// Options change a private control plane (NewWith).
type Options struct {
	// Configure edits the cluster config before init (extra flags, say).
	Configure func(*clusterconfig.Config)
	// Supervised records the test process as the directory's supervisor, which
	// takes `certs renew`'s restart requests (controlplane.Options.WritePIDFile).
	Supervised bool
}

// NewWith is New with o.
func NewWith(t testing.TB, o Options) *Cluster {
	t.Helper()
	Require(t)
	dir, err := os.MkdirTemp("", "gpurack-testcluster-*")
	if err != nil {
		t.Fatal(err)
	}
	shared.Lock()
	hooked := shared.main
	shared.Unlock()
	c, err := start(dir, o, hooked)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("testcluster: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}

var shared struct {
	sync.Mutex
	main    bool
	cluster *Cluster
	err     error
}

// Main runs the tests of a package that uses Shared and then stops the
// shared control plane. Call it from TestMain: os.Exit(testcluster.Main(m)).
//
// A test binary started as `BINARY logs-gateway …` runs the log gateway instead of the
// tests, and `BINARY registry-auth …` the registry's token issuer: a control plane runs
// these components as this program (controlplane.Options.Executable), which in a test
// is the test binary.
func Main(m *testing.M) int {
	if len(os.Args) > 1 && (os.Args[1] == logsgateway.Command || os.Args[1] == registryauth.Command) {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		run := logsgateway.Main
		if os.Args[1] == registryauth.Command {
			run = registryauth.Main
		}
		if err := run(ctx, os.Args[2:], os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, os.Args[1]+":", err)
			return 1
		}
		return 0
	}
	shared.Lock()
	shared.main = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.cluster != nil {
		shared.cluster.stop()
		shared.cluster = nil
	}
	return code
}

// Shared returns the test binary's control plane, starting it on first use.
// The package's TestMain must call Main, which stops it at the end.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	Require(t)
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		t.Fatal("testcluster.Shared needs TestMain to call testcluster.Main(m), which stops the shared control plane")
	}
	if shared.cluster == nil && shared.err == nil {
		dir, err := os.MkdirTemp("", "gpurack-testcluster-*")
		if err != nil {
			t.Fatal(err)
		}
		shared.cluster, shared.err = start(dir, Options{}, true)
		if shared.err != nil {
			os.RemoveAll(dir)
		}
	}
	if shared.err != nil {
		t.Fatalf("testcluster: %v", shared.err)
	}
	return shared.cluster
}

// Config returns a cluster.yaml configuration on free loopback ports.
func Config() (*clusterconfig.Config, error) {
	ports, err := FreePorts(8)
	if err != nil {
		return nil, err
	}
	cfg := clusterconfig.Default()
	cfg.ClusterName = "testcluster"
	cfg.APIServer.Port = ports[0]
	cfg.APIServer.Endpoint = fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg.Etcd.ClientPort, cfg.Etcd.PeerPort, cfg.Etcd.MetricsPort = ports[1], ports[2], ports[3]
	cfg.ControllerManager.Port, cfg.Scheduler.Port = ports[4], ports[5]
	// The log store's, used only with monitoring on.
	cfg.Monitoring.Logs.Port, cfg.Monitoring.Logs.Gateway.Port = ports[6], ports[7]
	// Tests do not need durability against power loss, and fsync is the
	// slowest part of etcd on a shared disk.
	cfg.Etcd.ExtraArgs = map[string]string{"unsafe-no-fsync": "true"}
	nfs := TestNFS
	cfg.Storage.NFS = &nfs
	return &cfg, nil
}

// TestNFS is the test clusters' NFS export (storage.nfs): an address of TEST-NET-1
// that serves nothing, so the gpurack-shared class and the admission rules for its
// volumes exist, and no volume of it can be mounted.
var TestNFS = clusterconfig.NFS{Server: "192.0.2.10", Share: "/srv/gpurack",
	MountOptions: clusterconfig.DefaultNFSMountOptions, OnDelete: "archive"}

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// start brings a control plane up in dir. Free ports can be taken by
// another test between choosing and binding them, so a port clash is
// retried with new ports. hooked says the package's TestMain calls Main, which
// answers the log gateway's subcommand, so the test binary can run the gateway.
func start(dir string, o Options, hooked bool) (*Cluster, error) {
	var lastErr error
	for attempt := range 3 {
		if attempt > 0 {
			os.RemoveAll(filepath.Join(dir, "etcd"))
		}
		cfg, err := Config()
		if err != nil {
			return nil, err
		}
		if o.Configure != nil {
			o.Configure(cfg)
		}
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		if cfg.Monitoring.LogsEnabled() && !hooked {
			return nil, errors.New("monitoring.logs runs the log gateway as this test binary: the package's TestMain must call testcluster.Main(m) (or set monitoring.logs.enabled to false)")
		}
		cp, err := controlplane.Init(context.Background(), controlplane.Options{
			Dir: dir, Config: cfg, Mode: controlplane.Foreground, WritePIDFile: o.Supervised,
			Logf:       fileLogger(filepath.Join(dir, "logs", "supervisor.log")),
			Executable: self,
		})
		if err != nil {
			lastErr = err
			var pe *components.PortInUseError
			var ce *controlplane.ComponentError
			if errors.As(err, &pe) || (errors.As(err, &ce) && strings.Contains(ce.Error(), "in use")) {
				continue
			}
			return nil, err
		}
		enroller := filepath.Join(dir, "enroller", joinconfig.EnrollerKubeconfigFile)
		data, err := joinconfig.EnrollerKubeconfig(cfg, cp.PKI)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(enroller), 0o700)
		}
		if err == nil {
			err = os.WriteFile(enroller, data, 0o600)
		}
		if err != nil {
			cp.Stop()
			return nil, err
		}
		return &Cluster{
			Dir: dir, AdminKubeconfig: cp.AdminKubeconfig(), EnrollerKubeconfig: enroller,
			Server: cfg.APIServerURL(), CAPEM: cp.PKI.CACertPEM(), CAPin: cp.PKI.CAPin(),
			Config: cfg, cp: cp,
		}, nil
	}
	return nil, lastErr
}

func fileLogger(path string) func(string, ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		os.MkdirAll(filepath.Dir(path), 0o755)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s %s\n", time.Now().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
	}
}

func (c *Cluster) stop() {
	c.cp.Stop()
	os.RemoveAll(c.Dir)
}

// ControlPlane is the running control plane (its supervisor, layout, PKI).
func (c *Cluster) ControlPlane() *controlplane.ControlPlane { return c.cp }

// RESTConfig returns an admin client configuration.
func (c *Cluster) RESTConfig(t testing.TB) *rest.Config {
	t.Helper()
	return RESTConfigFrom(t, c.AdminKubeconfig)
}

// RESTConfigFrom loads a kubeconfig file.
func RESTConfigFrom(t testing.TB, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kubeconfig, err)
	}
	return cfg
}

// Clientset returns an admin clientset.
func (c *Cluster) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Impersonate returns a clientset acting as user in groups, through the admin
// credential.
func (c *Cluster) Impersonate(t testing.TB, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.RESTConfig(t))
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// NodeClientset acts as node's kubelet does (system:node:NODE in system:nodes),
// once the apiserver enforces the local-volume admission policy that judges nodes'
// volume writes (init applies it; a new policy takes a moment to load).
func (c *Cluster) NodeClientset(t testing.TB, node string) kubernetes.Interface {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := localvolumes.WaitPolicy(ctx, c.RESTConfig(t)); err != nil {
		t.Fatal(err)
	}
	return c.Impersonate(t, "system:node:"+node, joinconfig.NodesGroup, "system:authenticated")
}

// JoinToken creates a bootstrap token (TTL 15 minutes, the gpuboot default;
// usages authentication and signing; group
// system:bootstrappers:kubeadm:default-node-token), waits until
// cluster-info is signed with it, and returns it as "abcdef.0123456789abcdef".
// t.Cleanup deletes it if it still exists.
func (c *Cluster) JoinToken(t testing.TB) string {
	t.Helper()
	cs := c.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tok, err := joinconfig.CreateToken(ctx, cs, joinconfig.TokenOptions{TTL: 15 * time.Minute, Description: "testcluster " + t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	if err := joinconfig.WaitSigned(ctx, cs, tok.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := joinconfig.RevokeToken(context.Background(), cs, tok.ID)
		if err != nil && !errors.Is(err, joinconfig.ErrNoSuchToken) {
			t.Logf("testcluster: delete token %s: %v", tok.ID, err)
		}
	})
	return tok.String()
}

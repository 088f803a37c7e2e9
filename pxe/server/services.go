package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/httpboot"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/rollout"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// gpuboot is a running `gpuboot serve`: its configuration and what its services
// provide, each field set by one service's start, in the order of services.
type gpuboot struct {
	cfg *config.Config
	log *slog.Logger

	// pki
	ca       *pki.CA
	serverKP *pki.KeyPair
	// serverCert is the serving certificate in use: serverKP at start, then whatever
	// `gpuboot certs server` writes (read again when the files change).
	serverCert *serverCertificate
	revoked    *pki.RevocationList
	// inventory; shared is the cluster store when inventory.store is cluster (other
	// replicas write it too), nil with bbolt
	store  *countingStore
	shared *kubestore.Store
	// policy
	policy  policy.Policy
	ekRoots *enroll.EKRoots
	// gossip keys
	racks map[string]enroll.Rack
	// cluster: nil without cluster.kubeconfig; settings are what nodes are told of
	// the cluster (gpuboot.yaml's cluster, filled from and checked against the
	// cluster's own facts)
	cluster  *nodecontrol.Cluster
	nodes    *nodecontrol.Queue
	settings config.Cluster
	// enrollment
	enroll *enroll.Service
	// metrics
	metrics *prometheus.Registry
	// http
	boot     *httpboot.Handler
	httpAddr net.Addr
	ipxeDir  string
	// rollouts
	rollouts *rollout.Controller
	// tls
	tlsAddr net.Addr
}

// services are gpuboot's services in start order. A new listener goes here as one
// more service, after those it needs (see docs/architecture.md, "gpuboot's services").
func (g *gpuboot) services() []service {
	return []service{
		{name: "pki", provides: []string{"ca", "server certificate", "revocations"}, start: g.startPKI},
		{name: "inventory", provides: []string{"store"}, start: g.startInventory},
		{name: "policy", provides: []string{"policy", "ek roots"}, start: g.startPolicy},
		{name: "gossip keys", provides: []string{"racks"}, start: g.startGossipKeys},
		{name: "cluster", provides: []string{"cluster", "cluster settings", "node queue"}, start: g.startCluster},
		{name: "enrollment", needs: []string{"ca", "revocations", "store", "policy", "ek roots", "racks", "cluster", "cluster settings", "node queue"},
			provides: []string{"enrollment"}, start: g.startEnrollment},
		{name: "node controller", needs: []string{"cluster", "node queue", "enrollment"}, start: g.startNodeController},
		{name: "metrics", needs: []string{"store", "enrollment"}, provides: []string{"metrics"}, start: g.startMetrics},
		{name: "http", needs: []string{"ca", "enrollment", "metrics"}, provides: []string{"boot script url"}, start: g.startHTTP},
		{name: "rollouts", needs: []string{"enrollment", "cluster", "boot script url"}, provides: []string{"rollouts"}, start: g.startRollouts},
		{name: "tls", needs: []string{"ca", "server certificate", "revocations", "store", "enrollment", "cluster", "rollouts", "metrics"}, start: g.startTLS},
		{name: "dhcp", needs: []string{"boot script url", "metrics"}, start: g.startDHCP},
		{name: "tftp", needs: []string{"metrics"}, start: g.startTFTP},
	}
}

// announce logs that gpuboot serves, once every service has started.
func (g *gpuboot) announce() {
	cfg := g.cfg
	g.log.Info("gpuboot serving", "http", g.httpAddr.String(), "tls", g.tlsAddr.String(), "advertise", cfg.Advertise,
		"approval", g.policy.Mode, "unknownMachines", cfg.Enrollment.UnknownMachines, "reenroll", cfg.Enrollment.Reenroll, "identity", cfg.Enrollment.Identity,
		"ca_pin", g.ca.Pin(), "cluster", g.cluster != nil)
}

func (g *gpuboot) startPKI(context.Context) (started, error) {
	cfg := g.cfg
	var err error
	if g.ca, err = pki.LoadCA(cfg.PKIDir()); err != nil {
		return started{}, fmt.Errorf("%w (run `gpuboot init --state-dir %s --advertise …` first)", err, cfg.StateDir)
	}
	if g.serverKP, err = pki.LoadKeyPair(cfg.ServerCertPath(), cfg.ServerKeyPath()); err != nil {
		return started{}, fmt.Errorf("server certificate: %w", err)
	}
	if g.serverCert, err = loadServerCertificate(cfg.ServerCertPath(), cfg.ServerKeyPath(), g.ca.Cert, g.log); err != nil {
		return started{}, err
	}
	g.revoked = pki.NewRevocationList()
	if _, err := os.Stat(cfg.RevocationsPath()); err == nil {
		if g.revoked, err = pki.LoadRevocationList(cfg.RevocationsPath()); err != nil {
			return started{}, err
		}
	}
	return started{}, nil
}

// startInventory opens the inventory: the bbolt file, or the cluster store
// (inventory.store: cluster). Every write goes through the counting store, which keeps
// the machines-by-state gauge; a cluster store, which other replicas write too, is
// recounted every recountEvery.
func (g *gpuboot) startInventory(ctx context.Context) (started, error) {
	if g.cfg.Inventory.Store == config.InventoryCluster {
		return g.startClusterInventory(ctx)
	}
	bolt, err := inventory.OpenBolt(g.cfg.InventoryPath())
	if err != nil {
		return started{}, err
	}
	if g.store, err = newCountingStore(ctx, bolt); err != nil {
		bolt.Close()
		return started{}, err
	}
	return started{release: func() { bolt.Close() }}, nil
}

func (g *gpuboot) startClusterInventory(ctx context.Context) (started, error) {
	if _, err := os.Stat(g.cfg.InventoryPath()); err == nil {
		g.log.Warn("inventory.store is cluster: the bbolt inventory in the state directory is not read (move it with `gpuboot inventory migrate`)", "file", g.cfg.InventoryPath())
	}
	ks, err := OpenClusterStore(ctx, g.cfg.Cluster.Kubeconfig)
	if err != nil {
		return started{}, err
	}
	g.shared = ks
	if g.store, err = newCountingStore(ctx, ks); err != nil {
		return started{}, err
	}
	recount := func() error {
		t := time.NewTicker(recountEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if err := g.store.recount(ctx); err != nil && ctx.Err() == nil {
					g.log.Warn("machines by state not recounted", "err", err)
				}
			}
		}
	}
	return started{loops: []loop{{name: "inventory recount", run: recount}}}, nil
}

func (g *gpuboot) startPolicy(context.Context) (started, error) {
	cfg, log := g.cfg, g.log
	mode, _ := policy.ParseMode(cfg.Policy.Approval)
	g.policy = policy.Policy{Mode: mode}
	var err error
	if len(cfg.Policy.Allowlist) > 0 {
		if g.policy.List, err = policy.LoadLists(cfg.Policy.Allowlist...); err != nil {
			return started{}, err
		}
	}
	if w := g.policy.Warning(); w != "" {
		log.Warn(w)
	}
	if cfg.Enrollment.AllowSimulated {
		log.Warn("enrollment.allowSimulated is on: machines whose agent runs the simulator GPU backend (no real GPUs) can become ready; use it only in labs and demos")
	}
	if len(cfg.Enrollment.EKRoots) > 0 {
		if g.ekRoots, err = enroll.LoadEKRoots(cfg.Enrollment.EKRoots); err != nil {
			return started{}, err
		}
		log.Info("TPMs must be certified by a vendor: EK certificates must chain to enrollment.ekRoots", "roots", g.ekRoots.Roots())
	}
	return started{}, nil
}

func (g *gpuboot) startGossipKeys(context.Context) (started, error) {
	g.racks = map[string]enroll.Rack{}
	for _, r := range g.cfg.Racks {
		p, key, err := EnsureGossipKey(g.cfg.StateDir, r.Name)
		if err != nil {
			return started{}, err
		}
		g.racks[r.Name] = enroll.Rack{Name: r.Name, DefaultImage: r.DefaultImage, GossipKey: key}
		g.log.Debug("gossip key", "rack", r.Name, "file", p)
	}
	return started{}, nil
}

// startCluster loads the enroller kubeconfig, if there is one, reads the cluster's
// networking facts and settles what nodes are told of the cluster (decision 0672),
// and makes the queue the enrollment service and the node controller share.
func (g *gpuboot) startCluster(ctx context.Context) (started, error) {
	g.settings = g.cfg.Cluster
	if g.cfg.Cluster.Kubeconfig == "" {
		g.log.Warn("no cluster.kubeconfig: JoinBundles carry no Kubernetes endpoint or bootstrap token, and the node controller does not run")
		return started{}, nil
	}
	var err error
	if g.cluster, err = nodecontrol.Load(g.cfg.Cluster.Kubeconfig); err != nil {
		return started{}, err
	}
	n, err := readNetworking(ctx, g.cluster)
	switch {
	case errors.Is(err, nodecontrol.ErrNetworkingUnpublished):
		g.log.Warn("gpuboot.yaml's cluster.podNetwork.subnet, cluster.dns and cluster.domain go to nodes unchecked: the cluster's own are not readable (run `controlplane-bootstrap init` again to grant the enroller kube-system/kubeadm-config)", "err", err)
	case err != nil:
		return started{}, err
	default:
		if g.settings, err = g.cfg.WithCluster(config.ClusterFacts{PodSubnet: n.PodSubnet, ServiceSubnet: n.ServiceSubnet,
			DNSAddress: n.DNSAddress, DNSDomain: n.DNSDomain, Source: nodecontrol.NetworkingSource}); err != nil {
			return started{}, err
		}
		g.log.Info("cluster networking", "source", nodecontrol.NetworkingSource, "podSubnet", n.PodSubnet, "serviceSubnet", n.ServiceSubnet,
			"dns", n.DNSAddress, "domain", n.DNSDomain, "endpoint", n.ControlPlaneEndpoint)
		if ep := strings.TrimPrefix(g.cluster.Endpoint(), "https://"); n.ControlPlaneEndpoint != "" && ep != n.ControlPlaneEndpoint {
			g.log.Warn("nodes are given the enroller kubeconfig's API endpoint, which is not the one the cluster names", "kubeconfig", ep, "cluster", n.ControlPlaneEndpoint)
		}
	}
	g.nodes = nodecontrol.NewQueue()
	return started{}, nil
}

// networkingWait bounds how long gpuboot waits at start for the apiserver to answer.
const networkingWait = 30 * time.Second

// readNetworking reads the cluster's networking facts, retrying for networkingWait
// while the apiserver does not answer (gpuboot may start before it).
func readNetworking(ctx context.Context, c *nodecontrol.Cluster) (nodecontrol.Networking, error) {
	ctx, cancel := context.WithTimeout(ctx, networkingWait)
	defer cancel()
	for {
		n, err := c.Networking(ctx)
		if err == nil || errors.Is(err, nodecontrol.ErrNetworkingUnpublished) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("the cluster's networking facts (cluster.kubeconfig %s): %w", c.Endpoint(), err)
		case <-time.After(time.Second):
		}
	}
}

func (g *gpuboot) startEnrollment(ctx context.Context) (started, error) {
	cfg := g.cfg
	ecfg := enroll.Config{
		Store: g.store, Policy: g.policy, Selectors: cfg.Selectors, Racks: g.racks, DefaultRack: cfg.DefaultRack,
		GossipKeyDir:    filepath.Join(cfg.StateDir, "gossip"),
		UnknownMachines: enroll.UnknownMachines(cfg.Enrollment.UnknownMachines), Reenroll: enroll.Reenroll(cfg.Enrollment.Reenroll),
		Identity: enroll.IdentityMode(cfg.Enrollment.Identity), EKRoots: g.ekRoots,
		CA: g.ca, Revocations: g.revoked, RevocationsPath: cfg.RevocationsPath(),
		ClusterDNS: g.settings.DNS, ClusterDomain: g.settings.Domain, NodeNamePrefix: cfg.Enrollment.NodeNamePrefix,
		PodNetwork:   &bootv1.PodNetwork{Subnet: g.settings.PodNetwork.Subnet, Backend: g.settings.PodNetwork.Backend},
		LogsEndpoint: cfg.Cluster.LogsEndpoint, Registry: cfg.Cluster.Registry, APIServers: cfg.Cluster.APIServers,
		MaxUnapproved: cfg.Enrollment.MaxUnapproved, CreateRate: cfg.Enrollment.CreateRate, CreateBurst: cfg.Enrollment.CreateBurst,
		MaxUnapprovedBytes: cfg.Enrollment.MaxUnapprovedBytes,
		AllowSimulated:     cfg.Enrollment.AllowSimulated,
		AgentCertValidity:  cfg.Enrollment.AgentCertValidity,
		BMC:                loadBMCAccess(cfg.StateDir, g.log),
		Log:                g.log,
	}
	if g.cluster != nil {
		ecfg.Cluster = g.cluster
		ecfg.OnChange = func(m *inventory.Machine) { g.nodes.Enqueue(m.NodeName) }
	}
	for _, w := range enroll.StartWarnings(ecfg) {
		g.log.Warn(w)
	}
	var err error
	g.enroll, err = enroll.New(ctx, ecfg)
	return started{}, err
}

func (g *gpuboot) startNodeController(ctx context.Context) (started, error) {
	if g.cluster == nil {
		return started{}, nil
	}
	if g.cfg.Cluster.ClearAfter != 0 {
		g.log.Warn("cluster.clearAfter is ignored: the taint follows GPUHealthy and the agent's --clear-after is the only hysteresis (decision 0205); remove it from the configuration")
	}
	newController := func() *nodecontrol.Controller {
		return nodecontrol.NewController(g.cluster, g.enroll, nodecontrol.Options{
			Queue: g.nodes, Effect: corev1Effect(g.cfg.Cluster.UnhealthyEffect), Log: g.log})
	}
	if g.shared == nil {
		ctl := newController()
		return started{loops: []loop{{name: "node controller", run: func() error { return ctl.Run(ctx) }}}}, nil
	}
	run, err := g.electedNodeController(ctx, newController)
	if err != nil {
		return started{}, err
	}
	return started{loops: []loop{{name: "node controller", run: run}}}, nil
}

func (g *gpuboot) startMetrics(context.Context) (started, error) {
	g.metrics = prometheus.NewRegistry()
	g.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g.metrics.MustRegister(newInventoryCollector(g.enroll, g.store.byClass))
	g.metrics.MustRegister(newCertificateCollector(g.ca.Cert, g.serverCert, g.cfg.StateDir, g.revoked, g.log))
	return started{}, nil
}

// startHTTP serves plain HTTP: /boot.ipxe, /images (and /ipxe with TFTP on; /metrics
// with metrics.plainHTTP).
func (g *gpuboot) startHTTP(context.Context) (started, error) {
	cfg := g.cfg
	_, tlsPort, _ := net.SplitHostPort(cfg.Listen.TLS)
	_, httpPort, _ := net.SplitHostPort(cfg.Listen.HTTP)
	keys, err := manifest.LoadPublicKeys(cfg.Images.TrustedKeys...)
	if err != nil {
		return started{}, fmt.Errorf("images.trustedKeys: %w", err)
	}
	if cfg.TFTPEnabled() {
		g.ipxeDir = tftpDir(cfg)
	}
	g.boot, err = httpboot.NewHandler(httpboot.Config{
		ImageStore: cfg.Images.Store, TrustedKeys: keys,
		// Verified artifacts are served from private copies (unlinked, so the
		// directory stays empty): the store's files may change after verification.
		VerifiedCopies: filepath.Join(cfg.StateDir, "verified-images"),
		BaseURL:        "http://" + net.JoinHostPort(cfg.Advertise, httpPort),
		EnrollAddr:     net.JoinHostPort(cfg.Advertise, tlsPort), EnrollCAPin: g.ca.Pin(),
		IPXEDir: g.ipxeDir, Registry: g.metrics, NoMetrics: !cfg.Metrics.PlainHTTP, Log: g.log,
	}, httpboot.BooterFunc(g.decideBoot))
	if err != nil {
		return started{}, err
	}
	lis, err := net.Listen("tcp", cfg.Listen.HTTP)
	if err != nil {
		return started{}, fmt.Errorf("listen.http: %w", err)
	}
	g.httpAddr = lis.Addr()
	srv := newHTTPServer(g.boot, defaultHTTPLimits)
	return started{loops: []loop{{name: "http", run: func() error { return srv.Serve(lis) },
		stop: func(ctx context.Context) { srv.Shutdown(ctx) }}}}, nil
}

// decideBoot is httpboot's Booter: the enrollment service decides.
func (g *gpuboot) decideBoot(ctx context.Context, id identity.Identity, remote netip.Addr) (httpboot.Target, error) {
	d, err := g.enroll.DecideBoot(ctx, id, remote)
	if err != nil {
		return httpboot.Target{}, err
	}
	if d.Action == enroll.BootHold {
		return httpboot.Target{Action: httpboot.Hold}, nil
	}
	return httpboot.Target{Action: httpboot.Boot, ImageID: d.ImageID}, nil
}

// startTLS serves the TLS port: gRPC (Enrollment, Admin, reflection) and the REST API
// and rack view.
func (g *gpuboot) startTLS(context.Context) (started, error) {
	cfg := g.cfg
	gs := grpc.NewServer(grpcServerOptions(newSourceLimiter(cfg.Enrollment.SourceRate, cfg.Enrollment.SourceBurst))...)
	bootv1.RegisterEnrollmentServiceServer(gs, g.enroll)
	rackNames := make([]string, 0, len(cfg.Racks))
	for _, r := range cfg.Racks {
		rackNames = append(rackNames, r.Name)
	}
	active := openAlerts(cfg.StateDir, g.metrics, g.log)
	adm, err := admin.New(admin.Config{Lifecycle: g.enroll, Inventory: g.store, CA: g.ca.Cert, Revoked: g.enroll.Revoked,
		Racks: rackNames, Tokens: mustTokens(cfg, g.log), Gossip: g.enroll,
		Operators: &operatorCreds{stateDir: cfg.StateDir, tokensFile: cfg.Admin.TokensFile, svc: g.enroll, log: g.log},
		Quotas:    tenantQuotas(g.cluster), Rollouts: g.rollouts, NextImage: g.nextImage, Alerts: active,
		PrometheusURL: cfg.Metrics.PrometheusURL, Metrics: promhttp.HandlerFor(g.metrics, promhttp.HandlerOpts{})})
	if err != nil {
		return started{}, err
	}
	bootv1.RegisterAdminServiceServer(gs, adm)
	reflection.Register(gs)
	restHandler := adm.Handler()
	lis, err := net.Listen("tcp", cfg.Listen.TLS)
	if err != nil {
		return started{}, fmt.Errorf("listen.tls: %w", err)
	}
	g.tlsAddr = lis.Addr()
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		restHandler.ServeHTTP(w, r)
	}), defaultHTTPLimits)
	srv.TLSConfig = &tls.Config{
		MinVersion:       tls.VersionTLS12,
		GetCertificate:   g.serverCert.GetCertificate,
		ClientAuth:       tls.VerifyClientCertIfGiven,
		ClientCAs:        g.ca.CertPool(),
		VerifyConnection: g.revoked.VerifyConnection,
		NextProtos:       []string{"h2", "http/1.1"},
	}
	return started{loops: []loop{{name: "tls", run: func() error { return srv.ServeTLS(lis, "", "") },
		stop: func(ctx context.Context) {
			if srv.Shutdown(ctx) != nil {
				srv.Close()
			}
			gs.Stop()
		}}}}, nil
}

func (g *gpuboot) startTFTP(ctx context.Context) (started, error) {
	if !g.cfg.TFTPEnabled() {
		return started{}, nil
	}
	ts, err := tftp.New(tftp.Config{Dir: g.ipxeDir, SinglePort: g.cfg.TFTP.SinglePort}, tftp.NewMetrics(g.metrics), g.log)
	if err != nil {
		return started{}, err
	}
	conn, err := tftp.Listen(":69")
	if err != nil {
		return started{}, err
	}
	return started{loops: []loop{{name: "tftp", run: func() error { return ts.Serve(ctx, conn) }}}}, nil
}
